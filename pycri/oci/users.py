"""Resolve a container's uid, gid and groups from its rootfs's /etc/passwd and /etc/group.

Parsing and resolution are pure so every USER form is unit-testable; the one I/O
helper reads those files through rootfs.read_file, so a hostile image reaches nothing
on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pycri.errors import InvalidArgument
from pycri.oci import rootfs

# A hostile image could ship a huge /etc/passwd; nothing legitimate comes close.
MAX_FILE_BYTES = 4 << 20


@dataclass(frozen=True)
class PasswdEntry:
    name: str
    uid: int
    gid: int
    home: str


@dataclass(frozen=True)
class GroupEntry:
    name: str
    gid: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class ResolvedUser:
    """What goes into the OCI `process.user`: additional_gids starts with the primary gid."""

    uid: int
    gid: int
    additional_gids: tuple[int, ...] = ()
    username: str = ""
    home: str = "/"


@dataclass(frozen=True)
class UserRequest:
    """The CRI security-context fields that pick a user, plus the image's USER."""

    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_username: str = ""
    image_user: str = ""
    supplemental_groups: Sequence[int] = field(default_factory=tuple)
    strict_groups: bool = False  # SupplementalGroupsPolicy Strict


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def parse_passwd(text: str) -> list[PasswdEntry]:
    """Parse passwd(5) lines; malformed lines are skipped like libc does."""
    out: list[PasswdEntry] = []
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) < 4 or line.startswith(("#", "+", "-")):
            continue
        uid, gid = _int(parts[2]), _int(parts[3])
        if not parts[0] or uid is None or gid is None:
            continue
        home = parts[5] if len(parts) > 5 and parts[5] else "/"
        out.append(PasswdEntry(parts[0], uid, gid, home))
    return out


def parse_group(text: str) -> list[GroupEntry]:
    """Parse group(5) lines; malformed lines are skipped."""
    out: list[GroupEntry] = []
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) < 3 or line.startswith(("#", "+", "-")):
            continue
        gid = _int(parts[2])
        if not parts[0] or gid is None:
            continue
        members = tuple(m for m in parts[3].split(",") if m) if len(parts) > 3 else ()
        out.append(GroupEntry(parts[0], gid, members))
    return out


def _lookup_user(users: list[PasswdEntry], spec: str) -> PasswdEntry | None:
    uid = _int(spec)
    for u in users:
        if (uid is not None and u.uid == uid) or (uid is None and u.name == spec):
            return u
    return None


def _lookup_gid(groups: list[GroupEntry], spec: str) -> int:
    gid = _int(spec)
    if gid is not None:
        return gid
    for g in groups:
        if g.name == spec:
            return g.gid
    raise InvalidArgument(f"group {spec!r} not found in the image's /etc/group")


def resolve_user(req: UserRequest, passwd: str, group: str) -> ResolvedUser:
    """Apply the CRI precedence: run_as_user > run_as_username > image USER.

    A numeric uid need not exist in /etc/passwd (gid then defaults to 0); a name must.
    run_as_group overrides whatever gid the user form gave.
    """
    if req.run_as_group is not None and req.run_as_user is None and not req.run_as_username:
        # The kubelet never sends this; a group without a user is ambiguous, so refuse it.
        raise InvalidArgument("run_as_group is set without run_as_user or run_as_username")
    users = parse_passwd(passwd)
    groups = parse_group(group)
    if req.run_as_user is not None:
        if req.run_as_user < 0:
            raise InvalidArgument(f"run_as_user {req.run_as_user} is negative")
        user_spec, group_spec = str(req.run_as_user), ""
    elif req.run_as_username:
        user_spec, group_spec = req.run_as_username, ""
    else:
        user_spec, _, group_spec = req.image_user.partition(":")
        if ":" in req.image_user and not group_spec:
            raise InvalidArgument(f"image user {req.image_user!r} has an empty group")
        user_spec = user_spec or "0"

    entry = _lookup_user(users, user_spec)
    if entry is None and _int(user_spec) is None:
        raise InvalidArgument(f"user {user_spec!r} not found in the image's /etc/passwd")
    uid = entry.uid if entry else int(user_spec)
    gid = entry.gid if entry else 0
    if group_spec:
        gid = _lookup_gid(groups, group_spec)
    if req.run_as_group is not None:
        if req.run_as_group < 0:
            raise InvalidArgument(f"run_as_group {req.run_as_group} is negative")
        gid = req.run_as_group

    gids: list[int] = [gid]
    if entry is not None and not req.strict_groups:
        gids.extend(g.gid for g in groups if entry.name in g.members)
    for g in req.supplemental_groups:
        if g < 0:
            raise InvalidArgument(f"supplemental group {g} is negative")
        gids.append(g)
    return ResolvedUser(
        uid=uid,
        gid=gid,
        additional_gids=tuple(dict.fromkeys(gids)),
        username=entry.name if entry else "",
        home=entry.home if entry else "/",
    )


def read_rootfs_file(root: str, path: str) -> str:
    """A small text file of the image (e.g. /etc/passwd); "" when it does not exist.

    Reached by rootfs.read_file's walk, so symlinks stay inside the image and a device
    node or FIFO in its place is refused without being opened. Blocks: call in a thread.
    """
    data = rootfs.read_file(root, path, MAX_FILE_BYTES)
    return "" if data is None else data.decode("utf-8", errors="replace")


def resolve_user_in_rootfs(root: str, req: UserRequest) -> ResolvedUser:
    """resolve_user() against the image's own /etc/passwd and /etc/group."""
    return resolve_user(
        req, read_rootfs_file(root, "/etc/passwd"), read_rootfs_file(root, "/etc/group")
    )
