"""Confinement beyond capabilities: AppArmor, SELinux labels, masked and read-only
/proc and /sys paths, and the seccomp filter (gated by the capabilities)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci import seccomp as seccomp_mod
from pycri.oci import selinux

DEFAULT_MASKED_PATHS: tuple[str, ...] = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)

DEFAULT_READONLY_PATHS: tuple[str, ...] = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)


def apparmor_profile(
    profile: pb.SecurityProfile | None,
    legacy: str,
    privileged: bool,
    enabled: bool,
    default_profile: str,
) -> str | None:
    """The process.apparmorProfile, or None. On a host without AppArmor RuntimeDefault is
    ignored but a Localhost profile is an error: silently running unconfined would lie."""
    if profile is not None:
        kind = profile.profile_type
        if kind == pb.SecurityProfile.Localhost:
            name = profile.localhost_ref.removeprefix("localhost/")
        elif kind == pb.SecurityProfile.Unconfined:
            return None
        else:
            name = ""
    elif legacy.startswith("localhost/"):
        name = legacy.removeprefix("localhost/")
    elif legacy in ("", "runtime/default", "unconfined"):
        if legacy == "unconfined":
            return None
        name = ""
    else:
        raise InvalidArgument(f"unknown apparmor profile {legacy!r}")
    if name:
        if not enabled:
            raise InvalidArgument(
                f"apparmor profile {name!r} was requested but AppArmor is not enabled on this host"
            )
        return name
    if not enabled or privileged or not default_profile:
        return None
    return default_profile


def selinux_labels(
    process: dict[str, Any], linux: dict[str, Any], options: pb.SELinuxOption
) -> None:
    """process.selinuxLabel and linux.mountLabel from the request's SELinux options."""
    process["selinuxLabel"] = selinux.process_label(options)
    linux["mountLabel"] = selinux.mount_label(options)


def confinement(
    masked_paths: Sequence[str],
    readonly_paths: Sequence[str],
    seccomp: Mapping[str, Any] | None,
    bounding: Sequence[str],
) -> dict[str, Any]:
    """The linux.* confinement of an unprivileged process: the requested masked and
    read-only paths (the defaults when empty) and the seccomp profile, its
    capability-gated rules resolved against the bounding set."""
    out: dict[str, Any] = {
        "maskedPaths": list(masked_paths or DEFAULT_MASKED_PATHS),
        "readonlyPaths": list(readonly_paths or DEFAULT_READONLY_PATHS),
    }
    if seccomp is not None:
        out["seccomp"] = seccomp_mod.for_capabilities(dict(seccomp), bounding)
    return out
