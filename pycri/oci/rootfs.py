"""Look into an image's rootfs from the host without ever leaving it.

A rootfs is hostile input: any path in it may be a symlink to a host directory, a
device node or a FIFO. Everything here walks it one component at a time with
O_PATH|O_NOFOLLOW file descriptors, resolving symlinks as if the rootfs were `/`,
and opens nothing for reading before its type is known. The functions block on the
filesystem; callers run them in a worker thread.

`pin_mount_destinations` applies the same walk to a spec's mounts before any runtime
sees them: runc 1.1.5 follows an image's `/dev` symlink on the host (it created and
deleted files in the directory it named), so runtime-managed paths must be real
directories, and every other destination is handed over already resolved.
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass, field
from typing import Any

from pycri.boundedjson import file_kind
from pycri.errors import InvalidArgument

MAX_SYMLINKS = 40
# The runtime mounts and creates nodes under these itself, with paths it joins naively.
RUNTIME_OWNED = ("/dev", "/proc", "/sys")
# Bound from the pod's files; an image needs no symlink out of itself for these.
POD_FILES = ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf")
_DIR_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Link:
    """One symlink met on the way: where it is (inside the root) and what it says."""

    path: str
    target: str
    leaves_root: bool  # followed by the host from where it lies, it would leave the rootfs


@dataclass
class Walk:
    """Where a path leads inside the root.

    `path` is absolute and symlink-free within the root; `mode` is the final component's
    st_mode (0 when it does not exist). A walk that reached one of its `stop_at` paths
    ends there: `covered` is set and the rest of the path is appended as given.
    """

    path: str
    mode: int = 0
    links: list[Link] = field(default_factory=list)
    covered: bool = False


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _leaves(depth: int, target: str) -> bool:
    """Whether a relative link `depth` directories below the root climbs above it."""
    if target.startswith("/"):
        return True
    for p in _parts(target):
        depth += -1 if p == ".." else 1
        if depth < 0:
            return True
    return False


def _walk(root_fd: int, path: str, stop_at: frozenset[str]) -> tuple[Walk, int | None]:
    """Resolve `path` below `root_fd`; returns the walk and an O_PATH fd of what it found
    (None when it is missing or the walk stopped early), which the caller closes."""
    names: list[str] = []
    fds: list[int] = []  # O_PATH fds of the directories in `names`
    pending = _parts(path)
    walk = Walk(path="/")
    found: int | None = None
    try:
        while pending:
            here = "/" + "/".join(names)
            if here in stop_at:
                walk.covered = True
                break
            name = pending.pop(0)
            if name == "..":
                if names:
                    names.pop()
                    os.close(fds.pop())
                continue
            parent = fds[-1] if fds else root_fd
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                pending.insert(0, name)
                break
            except NotADirectoryError:
                raise InvalidArgument(
                    f"{here} in the image is not a directory (on the way to {path})"
                ) from None
            st = os.fstat(fd)
            if not stat.S_ISLNK(st.st_mode):
                names.append(name)
                fds.append(fd)
                continue
            try:
                target = os.readlink("", dir_fd=fd)  # the link just opened, not its name again
            finally:
                os.close(fd)
            link_path = posixpath.join(here, name)
            walk.links.append(Link(link_path, target, _leaves(len(names), target)))
            if len(walk.links) > MAX_SYMLINKS:
                raise InvalidArgument(f"{path} in the image: too many levels of symlinks")
            if target.startswith("/"):
                names.clear()
                while fds:
                    os.close(fds.pop())
            pending = _parts(target) + pending
        else:
            if fds:
                found = fds.pop()
                walk.mode = os.fstat(found).st_mode
        here = "/" + "/".join(names)
        walk.covered = walk.covered or here in stop_at
        walk.path = posixpath.normpath(posixpath.join(here, *pending))
        return walk, found
    finally:
        for fd in fds:
            os.close(fd)


def read_file(root: str, path: str, max_bytes: int) -> bytes | None:
    """The content of a regular file of the image (None when it does not exist).

    The file is type-checked on its O_PATH fd and only then opened for reading
    through /proc/self/fd, so a device node or FIFO named e.g. /etc/passwd is never
    opened; one larger than `max_bytes` is refused before it is read.
    """
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _, fd = _walk(root_fd, path, frozenset())
    finally:
        os.close(root_fd)
    if fd is None:
        return None
    try:
        return read_regular(fd, f"{path} in the image", max_bytes)
    finally:
        os.close(fd)


def read_regular(path_fd: int, what: str, max_bytes: int) -> bytes:
    """Read the file behind an O_PATH fd if it is a regular file of at most `max_bytes`.

    The type is checked on the O_PATH fd, before anything is opened for reading, and
    the reopen through /proc/self/fd reaches that same inode: a FIFO cannot block the
    caller and a device node is never opened. Refusals are InvalidArgument naming `what`.
    """
    st = os.fstat(path_fd)
    if not stat.S_ISREG(st.st_mode):
        raise InvalidArgument(f"{what} is a {file_kind(st.st_mode)}, not a regular file")
    if st.st_size > max_bytes:
        raise InvalidArgument(f"{what} is larger than {max_bytes} bytes")
    fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise InvalidArgument(f"{what} is larger than {max_bytes} bytes")
    return data


def _under(path: str, tops: tuple[str, ...]) -> bool:
    return any(path == t or path.startswith(t + "/") for t in tops)


def _needs_dir(mount: dict[str, Any]) -> bool:
    """A bind of a non-directory needs a non-directory; every other mount a directory."""
    if mount.get("type") != "bind":
        return True
    try:
        return stat.S_ISDIR(os.stat(mount["source"]).st_mode)
    except OSError:
        return True  # the runtime reports a missing source itself


def _check_type(dest: str, walk: Walk, needs_dir: bool) -> None:
    """A directory for a directory; for a file, anything a runtime will not open (a
    regular file, or a socket some images leave behind), never a device node or FIFO."""
    mode = walk.mode
    if not mode or walk.covered:
        return  # missing: the runtime creates it, inside the rootfs
    if needs_dir and not stat.S_ISDIR(mode):
        raise InvalidArgument(
            f"mount destination {dest} is a {file_kind(mode)} in the image; "
            "the mount needs a directory there"
        )
    if not needs_dir and not (stat.S_ISREG(mode) or stat.S_ISSOCK(mode)):
        raise InvalidArgument(
            f"mount destination {dest} is a {file_kind(mode)} in the image; "
            "the mount needs a regular file there"
        )


def _refuse_link(dest: str, link: Link) -> InvalidArgument:
    return InvalidArgument(
        f"the image's {link.path} is a symlink (to {link.target!r}) on the way to "
        f"{dest}, which the runtime sets up itself; refusing an image that could make "
        "it write outside the container's rootfs"
    )


def pin_mount_destinations(root: str, doc: dict[str, Any]) -> None:
    """Check `doc`'s mounts and devices against the image in `root`; pin destinations.

    /dev, /proc, /sys (and whatever lies under them) must be reached without a symlink;
    /etc/hosts, /etc/resolv.conf and /etc/hostname without one that leaves the rootfs.
    Every other destination is rewritten to where it leads inside the rootfs, which is
    what runc and crun resolve it to anyway, so no runtime follows an image symlink.
    A destination that exists must be what its mount needs (a directory, or a regular
    file for a bind of a file). Whatever lies inside an earlier mount is not the image's
    and is left to the runtime. Refusals are InvalidArgument; nothing is changed on disk.
    """
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        mounted: set[str] = set()
        for mount in doc.get("mounts", []):
            dest = mount["destination"]
            walk, fd = _walk(root_fd, dest, frozenset(mounted))
            if fd is not None:
                os.close(fd)
            if not walk.covered:
                if _under(dest, RUNTIME_OWNED) and walk.links:
                    raise _refuse_link(dest, walk.links[0])
                leaving = [link for link in walk.links if link.leaves_root]
                if dest in POD_FILES and leaving:
                    raise _refuse_link(dest, leaving[0])
                _check_type(dest, walk, _needs_dir(mount))
            mount["destination"] = walk.path
            mounted.add(walk.path)
        for dev in doc.get("linux", {}).get("devices", []):
            walk, fd = _walk(root_fd, dev["path"], frozenset(mounted))
            if fd is not None:
                os.close(fd)
            if walk.links and not walk.covered:
                raise _refuse_link(dev["path"], walk.links[0])
            if walk.mode and not walk.covered and stat.S_ISDIR(walk.mode):
                raise InvalidArgument(f"device path {dev['path']} is a directory in the image")
        cwd = doc.get("process", {}).get("cwd", "/")
        walk, fd = _walk(root_fd, cwd, frozenset(mounted))
        if fd is not None:
            os.close(fd)
        if walk.mode and not walk.covered and not stat.S_ISDIR(walk.mode):
            raise InvalidArgument(
                f"working directory {cwd} is a {file_kind(walk.mode)} in the image")
    finally:
        os.close(root_fd)
