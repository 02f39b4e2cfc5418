"""Host-side checks the caller runs before spec generation: mount sources (devices are
pycri/devices.py's).

Kept apart from the spec package (oci/spec/) so that spec generation stays pure;
everything here reads the host (stat, /proc/self/mountinfo, /dev) and nothing here
changes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci import bindopts

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class HostPath:
    path: str  # symlinks resolved
    is_dir: bool


@dataclass(frozen=True)
class MountInfo:
    mount_id: int
    parent_id: int
    mount_point: str
    shared: bool  # optional field "shared:N"
    slave: bool  # optional field "master:N"


_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[MountInfo]:
    """Parse proc(5) mountinfo lines in order (later lines are mounted on top)."""
    out: list[MountInfo] = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 7 or "-" not in fields[6:]:
            continue
        optional = fields[6 : fields.index("-", 6)]
        out.append(
            MountInfo(
                mount_id=int(fields[0]),
                parent_id=int(fields[1]),
                mount_point=_unescape(fields[4]),
                shared=any(o.startswith("shared:") for o in optional),
                slave=any(o.startswith("master:") for o in optional),
            )
        )
    return out


def find_mount(path: str, mounts: list[MountInfo]) -> MountInfo:
    """The mount that holds `path` (an absolute, symlink-free path): the longest
    mount point above it, the last one listed when several are stacked."""
    best: MountInfo | None = None
    for m in mounts:
        mp = m.mount_point
        inside = path == mp or path.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) >= len(best.mount_point)):
            best = m
    if best is None:
        raise InvalidArgument(f"no mount holds {path}")
    return best


def validate_host_path(path: str) -> HostPath:
    """A CRI mount's host path must exist; symlinks are resolved so the bind sees the target."""
    if not os.path.isabs(path):
        raise InvalidArgument(f"mount host path {path!r} must be absolute")
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise InvalidArgument(f"mount host path {path} does not exist") from None
    except OSError as e:
        raise InvalidArgument(f"mount host path {path}: {e.strerror}") from None
    return HostPath(path=real, is_dir=stat.S_ISDIR(st.st_mode))


def check_propagation(path: str, propagation: int, mountinfo: str = MOUNTINFO) -> None:
    """Refuse a propagation the host mount cannot deliver, naming the mount to fix.

    BIDIRECTIONAL needs the source's mount to be shared; HOST_TO_CONTAINER needs it
    shared or a slave. Otherwise the container silently sees no propagation.
    """
    if propagation == pb.PROPAGATION_PRIVATE:
        return
    with open(mountinfo) as f:
        mount = find_mount(os.path.realpath(path), parse_mountinfo(f.read()))
    if propagation == pb.PROPAGATION_BIDIRECTIONAL and not mount.shared:
        raise InvalidArgument(
            f"path {path} is mounted on {mount.mount_point} but it is not a shared mount "
            "(bidirectional propagation needs `mount --make-rshared`)"
        )
    if propagation == pb.PROPAGATION_HOST_TO_CONTAINER and not (mount.shared or mount.slave):
        raise InvalidArgument(
            f"path {path} is mounted on {mount.mount_point} but it is not a shared or slave "
            "mount (host-to-container propagation needs `mount --make-rshared`)"
        )


_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_IDMAP = 0x00100000
_AT_EMPTY_PATH = 0x1000
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOVE_MOUNT_F_EMPTY_PATH = 4
# The same numbers on every architecture (added in Linux 5.2 and 5.12).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _set_attrs_recursively(path: str, attrs: int) -> None:
    attr = _MountAttr(attr_set=attrs)
    ret = _libc.syscall(
        _SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(), _AT_RECURSIVE, ctypes.byref(attr),
        ctypes.sizeof(attr),
    )
    _check(ret, f"mount_setattr(AT_RECURSIVE, {attrs:#x}) {path}")


def _make_target(source: str, target: Path) -> None:
    """The mount point of a staged copy: a 0700 directory, or an empty 0600 file."""
    private_dirs(target.parent)
    if os.path.isdir(source):
        target.mkdir(mode=0o700)
    else:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))


def stage_idmapped(
    source: str, target: Path, userns_fd: int, readonly: bool, recursive: bool = True
) -> None:
    """A copy of `source` (with its submounts, if `recursive`) at `target` whose files
    appear to the user namespace `userns_fd` as owned by the IDs they have on disk (and,
    with `readonly`, read-only: a recursively read-only idmapped mount is one staged copy).

    open_tree(OPEN_TREE_CLONE) makes a detached copy, mount_setattr(MOUNT_ATTR_IDMAP) maps
    it before anything can see it, move_mount attaches it. A bind of it (what the runtime
    is given) keeps the mapping: runc 1.1 cannot make idmapped mounts itself.
    """
    _make_target(source, target)
    try:
        rec = _AT_RECURSIVE if recursive else 0
        tree = _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, source.encode(),
                             _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | rec)
        if tree < 0:
            _check(tree, f"open_tree {source}")
        try:
            attr = _MountAttr(attr_set=_MOUNT_ATTR_IDMAP | (_MOUNT_ATTR_RDONLY if readonly else 0),
                              userns_fd=userns_fd)
            ret = _libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH | rec,
                                ctypes.byref(attr), ctypes.sizeof(attr))
            if ret != 0 and ctypes.get_errno() == errno.EINVAL:
                raise InvalidArgument(
                    f"{source} cannot be idmapped (its filesystem, or one mounted below it, "
                    "does not support idmapped mounts)")
            _check(ret, f"mount_setattr(MOUNT_ATTR_IDMAP) {source}")
            _check(_libc.syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, str(target).encode(),
                                 _MOVE_MOUNT_F_EMPTY_PATH), f"move_mount {source} to {target}")
        finally:
            os.close(tree)
    except BaseException:
        unstage(target)
        raise


def stage_rootfs(rootfs: str, staging: Path, uid: int, gid: int) -> Path:
    """A bind of a user-namespaced container's rootfs that the pod's root can reach.

    runc and crun open the rootfs from inside the user namespace, as a host user that
    cannot search the 0700 `<root>`; `staging` (0700, owned by the pod's root, in the
    0711 rootfs area) can be searched by that user alone. It stays until the container
    is removed: `runc exec` starts in that directory. Returns the bind's path.
    """
    private_dirs(staging.parent)
    os.mkdir(staging, 0o700)
    os.chown(staging, uid, gid)
    target = staging / "rootfs"
    target.mkdir(mode=0o700)
    try:
        _check(_libc.mount(rootfs.encode(), str(target).encode(), None, _MS_BIND | _MS_REC, None),
               f"bind {rootfs} on {target}")
        _check(_libc.mount(None, str(target).encode(), None, _MS_PRIVATE | _MS_REC, None),
               f"make {target} private")
    except OSError:
        unstage_all(staging)
        raise
    return target


def recursive_readonly_supported() -> bool:
    """Whether the kernel has mount_setattr(2) (an invalid call answers EBADF, not ENOSYS)."""
    ret = _libc.syscall(_SYS_MOUNT_SETATTR, -1, None, 0, None, 0)
    return ret == 0 or ctypes.get_errno() != errno.ENOSYS


def staging_area(state: str) -> Path:
    """Where copies are staged for the runtime during a create: `<state>/rro/<id>/<i>`."""
    return Path(state) / "rro"


def rootfs_area(state: str) -> Path:
    """Where user-namespaced rootfs binds live (0711): `<state>/rootfs/<id>/rootfs`."""
    return Path(state) / "rootfs"


def rootfs_staging(state: str, oid: str) -> Path:
    return rootfs_area(state) / oid


def open_rootfs_area(state: str) -> Path:
    """Create the rootfs area: 0711, since a user namespace's root must search it."""
    area = rootfs_area(state)
    with contextlib.suppress(FileExistsError):
        os.mkdir(area, 0o711)
    return area


def private_dirs(path: Path) -> None:
    """Create `path` and its missing parents as 0700 directories.

    A staged copy exposes a volume without the host directories that protected it
    (a secret under a 0750 parent), so every directory above it must be root-only
    from the moment it exists: mkdir(0700) (the umask can only take bits away),
    never a chmod after the fact. Directories that exist already are left alone.
    """
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
    if not path.is_dir() or path.is_symlink():
        raise OSError(errno.ENOTDIR, f"staging directory {path} is not a directory")


def stage_recursive_readonly(source: str, target: Path, options: Sequence[str] = ()) -> None:
    """Bind `source` (with its submounts) at `target` and make every mount of it read-only.

    A bind of this copy keeps each submount's read-only flag, which is how a container
    gets a recursively read-only volume from runtimes that lack the `rro` option. The
    mount's `noexec`, `nosuid` and `nodev` options (CRI `mount_options`) are set on every
    submount in the same call: the runtime's remount reaches only the top one.
    `target`'s parents are made root-only (see private_dirs).
    """
    _make_target(source, target)
    _check(_libc.mount(source.encode(), str(target).encode(), None, _MS_BIND | _MS_REC, None),
           f"bind {source} on {target}")
    try:
        _check(_libc.mount(None, str(target).encode(), None, _MS_PRIVATE | _MS_REC, None),
               f"make {target} private")
        _set_attrs_recursively(str(target), bindopts.mount_attrs(["ro", *options]))
    except OSError:
        unstage(target)
        raise


def unstage_all(staging: Path) -> None:
    """Detach every staged copy in `staging`, then remove the (now empty) directory.

    Only umount and rmdir/unlink: never a recursive delete, which would reach into a
    copy that is still mounted and delete the host's files.
    """
    if not staging.is_dir():
        return
    for target in staging.iterdir():
        unstage(target)
    staging.rmdir()


def unstage(target: Path) -> None:
    """Detach a staged copy (and everything under it); absent is fine."""
    if _libc.umount2(str(target).encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise OSError(err, f"umount {target}: {os.strerror(err)}")
    with contextlib.suppress(FileNotFoundError):
        if target.is_dir():
            target.rmdir()
        else:
            target.unlink()
