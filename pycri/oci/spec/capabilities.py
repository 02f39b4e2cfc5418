"""The process's capability sets: the defaults, CRI adds and drops, privileged, all
limited to what the daemon itself holds."""

from __future__ import annotations

from collections.abc import Iterable

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument

# Capability numbers 0..40, in kernel order.
ALL_CAPABILITIES: tuple[str, ...] = tuple(
    "CAP_" + n
    for n in [
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "KILL",
        "SETGID",
        "SETUID",
        "SETPCAP",
        "LINUX_IMMUTABLE",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_ADMIN",
        "NET_RAW",
        "IPC_LOCK",
        "IPC_OWNER",
        "SYS_MODULE",
        "SYS_RAWIO",
        "SYS_CHROOT",
        "SYS_PTRACE",
        "SYS_PACCT",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_NICE",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "MKNOD",
        "LEASE",
        "AUDIT_WRITE",
        "AUDIT_CONTROL",
        "SETFCAP",
        "MAC_OVERRIDE",
        "MAC_ADMIN",
        "SYSLOG",
        "WAKE_ALARM",
        "BLOCK_SUSPEND",
        "AUDIT_READ",
        "PERFMON",
        "BPF",
        "CHECKPOINT_RESTORE",
    ]
)

DEFAULT_CAPABILITIES: tuple[str, ...] = tuple(
    "CAP_" + n
    for n in [
        "CHOWN",
        "DAC_OVERRIDE",
        "FSETID",
        "FOWNER",
        "MKNOD",
        "NET_RAW",
        "SETGID",
        "SETUID",
        "SETFCAP",
        "SETPCAP",
        "NET_BIND_SERVICE",
        "SYS_CHROOT",
        "KILL",
        "AUDIT_WRITE",
    ]
)


def _cap_name(name: str) -> str:
    n = name.strip().upper()
    if n == "ALL":
        return n
    if not n.startswith("CAP_"):
        n = "CAP_" + n
    if n not in ALL_CAPABILITIES:
        raise InvalidArgument(f"unknown capability {name!r}")
    return n


def capabilities_from_mask(mask: int) -> tuple[str, ...]:
    """Names of the bits set in a /proc/<pid>/status Cap* mask (bits we know)."""
    return tuple(c for i, c in enumerate(ALL_CAPABILITIES) if mask >> i & 1)


def capabilities(
    cap: pb.Capability, privileged: bool, available: Iterable[str] = ALL_CAPABILITIES
) -> dict[str, list[str]]:
    """The OCI capability sets. Drops apply before adds, so `drop ALL, add X` keeps X;
    ambient capabilities are also put in every other set (the kernel requires it).

    Everything is limited to `available` (the daemon's own bounding set): runc and crun
    fail to start a process asking for a capability its parent lacks.
    """
    add = [_cap_name(c) for c in cap.add_capabilities]
    drop = [_cap_name(c) for c in cap.drop_capabilities]
    ambient = [_cap_name(c) for c in cap.add_ambient_capabilities]
    if "ALL" in ambient:
        raise InvalidArgument("ALL is not allowed in add_ambient_capabilities")
    if privileged:
        base = set(ALL_CAPABILITIES)
    else:
        base = set(ALL_CAPABILITIES if "ALL" in add else DEFAULT_CAPABILITIES)
        if "ALL" in drop:
            base = set()
        base -= set(drop)
        base |= {c for c in add if c != "ALL"}
    base |= set(ambient)
    have = set(available)

    def ordered(s: set[str]) -> list[str]:
        return [c for c in ALL_CAPABILITIES if c in s and c in have]

    return {
        "bounding": ordered(base),
        "effective": ordered(base),
        "permitted": ordered(base),
        "inheritable": ordered(set(ambient)),
        "ambient": ordered(set(ambient)),
    }
