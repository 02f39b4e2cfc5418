"""The spec's mounts: the kernel filesystems every process gets (/proc, /dev, /sys…),
the pod's files (/etc/hosts, /etc/hostname, /etc/resolv.conf) and the CRI mounts (host
binds, image volumes, the recursively read-only and idmapped copies). The host side —
resolving, staging those copies — is oci/mounts.py."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.cdi import edits as cdi_edits
from pycri.errors import InvalidArgument
from pycri.oci import bindopts
from pycri.oci.spec.namespaces import UserNamespace

_PROPAGATION = {
    pb.PROPAGATION_PRIVATE: "rprivate",
    pb.PROPAGATION_HOST_TO_CONTAINER: "rslave",
    pb.PROPAGATION_BIDIRECTIONAL: "rshared",
}


def _clean_dest(path: str) -> str:
    if not path.startswith("/"):
        raise InvalidArgument(f"container path {path!r} must be absolute")
    return posixpath.normpath(path).replace("//", "/")


def image_volume_key(index: int) -> str:
    """The `mount_sources` key of the image volume at `index` in the CRI mounts; host
    paths are absolute, so it cannot collide with one."""
    return f"image-volume:{index}"


def rro_key(index: int) -> str:
    """The `mount_sources` key of the staged, recursively read-only copy of mount `index`."""
    return f"recursive-read-only:{index}"


def idmap_key(index: int) -> str:
    """The `mount_sources` key of the staged, idmapped copy of mount `index` (also
    recursively read-only when the mount asks for both)."""
    return f"idmapped:{index}"


def is_idmapped(m: pb.Mount) -> bool:
    return bool(m.uidMappings or m.gidMappings)


def check_recursive_read_only(m: pb.Mount) -> None:
    """A recursively read-only mount must be read-only and private (the CRI contract)."""
    if not m.readonly:
        raise InvalidArgument(f"mount {m.container_path}: recursive_read_only needs readonly")
    if m.propagation != pb.PROPAGATION_PRIVATE:
        raise InvalidArgument(
            f"mount {m.container_path}: recursive_read_only needs private propagation"
        )


def cri_mounts(
    mounts: Iterable[pb.Mount], sources: Mapping[str, str]
) -> tuple[list[dict[str, Any]], str | None]:
    """CRI bind mounts and the rootfs propagation they need (None: leave the default).

    An image volume (`image` set) binds its prepared view, read-only and private: an
    image never changes, so propagation means nothing for it. A recursively read-only
    mount binds the copy the caller staged read-only on the host (`rro_key`): a bind of
    it keeps every submount read-only, which runc 1.1 and crun 1.8 cannot do themselves.
    `mount_options` merge into each bind's options (oci/bindopts.py); the runtimes apply
    them by remounting the bind.
    A mount with uid/gid mappings binds the idmapped copy the caller staged (`idmap_key`):
    runc 1.1 ignores the `idmap` option, so the runtime is only ever given a bind.
    """
    out: list[dict[str, Any]] = []
    rootfs_propagation: str | None = None
    for i, m in enumerate(mounts):
        dest = _clean_dest(m.container_path)
        if dest == "/":
            raise InvalidArgument("a mount cannot target the container's /")
        if m.image.image:
            check_image_volume(m)
            source = sources.get(image_volume_key(i))
            if source is None:
                raise InvalidArgument(f"mount {dest}: image volume was not prepared")
            # One overlay mount, no submounts: read-only is already recursive.
            out.append({"destination": dest, "type": "bind", "source": source,
                        "options": bindopts.merge(["rbind", "rprivate", "ro"],
                                                  m.mount_options)})
            continue
        if not m.host_path:
            raise InvalidArgument(f"mount {dest}: host path is empty")
        prop = _PROPAGATION.get(m.propagation)
        if prop is None:
            raise InvalidArgument(f"mount {dest}: unknown propagation {m.propagation}")
        opts = bindopts.merge(["rbind", prop, "ro" if m.readonly else "rw"], m.mount_options)
        source = sources.get(m.host_path, m.host_path)
        if m.recursive_read_only:
            check_recursive_read_only(m)
        staged_key = (idmap_key(i) if is_idmapped(m)
                      else rro_key(i) if m.recursive_read_only else None)
        if staged_key is not None:
            staged = sources.get(staged_key)
            if staged is None:
                raise InvalidArgument(f"mount {dest}: its copy ({staged_key}) was not staged")
            source = staged
        if prop == "rshared":
            rootfs_propagation = "rshared"
        elif prop == "rslave" and rootfs_propagation is None:
            rootfs_propagation = "rslave"
        out.append(
            {
                "destination": dest,
                "type": "bind",
                "source": source,
                "options": opts,
            }
        )
    return out, rootfs_propagation


def check_image_volume(m: pb.Mount) -> None:
    """The CRI rules of an image volume: read-only by definition, no host path."""
    if m.host_path:
        raise InvalidArgument(
            f"mount {m.container_path}: host_path and image are mutually exclusive"
        )
    if not m.readonly:
        raise InvalidArgument(
            f"mount {m.container_path}: image volumes are read-only; set readonly"
        )


TTY_GID = 5  # devpts gives new ptys this group, which must exist in a user namespace


def base_mounts(
    privileged: bool, shm_path: str | None, userns: UserNamespace | None = None
) -> list[dict[str, Any]]:
    """/proc, /dev, /sys and the rest every process gets: /sys writable only when
    privileged, /dev/shm the pod's (`shm_path`) or a private tmpfs."""
    sys_mode = "rw" if privileged else "ro"
    devpts = ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]
    if userns is None or userns.maps_gid(TTY_GID):  # else the kernel refuses the mount
        devpts.append(f"gid={TTY_GID}")
    shm: dict[str, Any]
    if shm_path:
        shm = {
            "destination": "/dev/shm",
            "type": "bind",
            "source": shm_path,
            "options": ["rbind", "rprivate", "nosuid", "nodev", "noexec", "rw"],
        }
    else:
        shm = {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        }
    return [
        {
            "destination": "/proc",
            "type": "proc",
            "source": "proc",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": devpts,
        },
        shm,
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", sys_mode],
        },
        {
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", sys_mode],
        },
    ]


def pod_file_mounts(
    hostname: str | None, hosts: str | None, resolv_conf: str | None, readonly: bool
) -> list[dict[str, Any]]:
    """Binds of the pod's /etc/hostname, /etc/hosts and /etc/resolv.conf (those it has)."""
    mode = "ro" if readonly else "rw"
    out = []
    for dest, src in (
        ("/etc/hostname", hostname),
        ("/etc/hosts", hosts),
        ("/etc/resolv.conf", resolv_conf),
    ):
        if src:
            out.append(
                {
                    "destination": dest,
                    "type": "bind",
                    "source": src,
                    "options": ["rbind", "rprivate", mode],
                }
            )
    return out


def merge_mounts(
    defaults: list[dict[str, Any]], user: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A user mount replaces the default at the same path; parents mount before children."""
    taken = {m["destination"] for m in user}
    merged = [m for m in defaults if m["destination"] not in taken] + user
    return sorted(merged, key=cdi_edits.mount_depth)


def relabel(entries: list[dict[str, Any]], mounts: Sequence[pb.Mount]) -> None:
    """`z` (shared relabel) on the binds whose CRI mount asks for it; an image volume is
    a read-only view that cannot be relabelled. `entries` are cri_mounts' output, one per
    CRI mount in the same order."""
    for entry, m in zip(entries, mounts, strict=True):
        if m.selinux_relabel and not m.image.image:
            entry["options"].append("z")
