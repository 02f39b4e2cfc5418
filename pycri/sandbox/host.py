"""What the daemon itself may hand on to a pod: read from /proc once, at start."""

from __future__ import annotations

from pycri.oci import spec


def own_oom_score_adj() -> int:
    with open("/proc/self/oom_score_adj") as f:
        return int(f.read().strip())


def own_capabilities() -> tuple[str, ...]:
    """The daemon's bounding set: a container can never get more (no CAP_SYS_RESOURCE here)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapBnd:"):
                return tuple(spec.capabilities_from_mask(int(line.split()[1], 16)))
    return tuple(spec.ALL_CAPABILITIES)
