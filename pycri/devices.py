"""Device nodes as facts of the host: what a CRI device, a CDI device node or a
privileged container's /dev names (type, major/minor, mode, owner), read with stat.
Below both cdi/ and oci/, which each turn them into a spec's devices.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument


@dataclass(frozen=True)
class DeviceInfo:
    """A device node as the container will see it (read from the host by `device_info`)."""

    path: str  # inside the container
    type: str  # "c", "b" or "p"
    major: int
    minor: int
    file_mode: int = 0o666
    uid: int = 0
    gid: int = 0
    permissions: str = "rwm"



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
    else:
        # A FIFO is not a device either: runc's cgroup rules have no type for it.
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
    if not os.path.isabs(dev.host_path):
        # realpath("") is the daemon's cwd: never walk that for device nodes.
        raise InvalidArgument(f"device host path {dev.host_path!r} must be absolute")
    perms = dev.permissions or "rwm"
    real = os.path.realpath(dev.host_path)
    if os.path.isdir(real):
        return _walk_devices(real, target, perms)
    return [device_info(real, target, perms)]


def host_devices(dev_root: str = "/dev") -> list[DeviceInfo]:
    """All host devices, as a privileged container gets them."""
    return _walk_devices(dev_root, "/dev")


# -- recursively read-only mounts -----------------------------------------------------
