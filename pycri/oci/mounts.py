"""Host-side checks the caller runs before spec generation: mount sources and devices.

Kept apart from spec.py so that spec generation stays pure; everything here reads the
host (stat, /proc/self/mountinfo, /dev) and nothing here changes it.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci.spec import DeviceInfo

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


def device_info(host_path: str, container_path: str = "", permissions: str = "rwm") -> DeviceInfo:
    """Describe one host device node for linux.devices; not a device → InvalidArgument."""
    if not permissions or set(permissions) - set("rwm"):
        raise InvalidArgument(f"device {host_path}: permissions {permissions!r} not within 'rwm'")
    try:
        st = os.stat(host_path)
    except OSError as e:
        raise InvalidArgument(f"device {host_path}: {e.strerror}") from None
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    elif stat.S_ISFIFO(st.st_mode):
        kind = "p"
    else:
        raise InvalidArgument(f"{host_path} is not a device node")
    return DeviceInfo(
        path=container_path or host_path,
        type=kind,
        major=os.major(st.st_rdev),
        minor=os.minor(st.st_rdev),
        file_mode=stat.S_IMODE(st.st_mode),
        uid=st.st_uid,
        gid=st.st_gid,
        permissions=permissions,
    )


def _walk_devices(root: str, container_root: str, permissions: str = "rwm") -> list[DeviceInfo]:
    """Every device node under `root`, renamed under `container_root`."""
    out: list[DeviceInfo] = []
    for dirpath, dirnames, filenames in os.walk(root):
        # pts and shm are per-container mounts; mqueue is not a device tree.
        dirnames[:] = sorted(d for d in dirnames if d not in ("pts", "shm", "mqueue"))
        for name in sorted(filenames):
            host = os.path.join(dirpath, name)
            try:
                st = os.lstat(host)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                rel = os.path.relpath(host, root)
                out.append(device_info(host, os.path.join(container_root, rel), permissions))
    return out


def resolve_device(dev: pb.Device) -> list[DeviceInfo]:
    """A CRI device: one node, or every node under a directory (e.g. /dev/snd)."""
    target = dev.container_path or dev.host_path
    if not os.path.isabs(target):
        raise InvalidArgument(f"device container path {target!r} must be absolute")
    perms = dev.permissions or "rwm"
    real = os.path.realpath(dev.host_path)
    if os.path.isdir(real):
        return _walk_devices(real, target, perms)
    return [device_info(real, target, perms)]


def host_devices(dev_root: str = "/dev") -> list[DeviceInfo]:
    """All host devices, as a privileged container gets them."""
    return _walk_devices(dev_root, "/dev")
