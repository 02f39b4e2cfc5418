"""Bind-mount options a CRI mount may ask for (`Mount.mount_options`), and how they merge.

Only per-mount-point flags are accepted: what `mount(MS_REMOUNT|MS_BIND)` can change
on a bind. runc 1.1.5 and crun 1.8.1 both bind first and then remount with these
flags (the kernel ignores them on the bind itself). Propagation has its own CRI field,
and anything naming a filesystem option (`size=`, `mode=`) means nothing for a bind,
so both are refused by the request gate (gate.py) rather than dropped.

Merging: the default options of a mount (`rbind`, its propagation, `ro`/`rw`) come
first; for each on/off pair the restrictive side wins wherever it appears (`ro` over
`rw`, `noexec` over `exec`, `nosuid` over `suid`, `nodev` over `dev`), so a request
can tighten a mount but never loosen what pycri or the CRI's `readonly` set; of the
access-time modes the last one given wins; duplicates are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable

# option -> (group, restrictive); restrictive wins inside its group.
_PAIRS: dict[str, tuple[str, bool]] = {
    "ro": ("ro", True), "rw": ("ro", False),
    "noexec": ("exec", True), "exec": ("exec", False),
    "nosuid": ("suid", True), "suid": ("suid", False),
    "nodev": ("dev", True), "dev": ("dev", False),
    "nodiratime": ("diratime", True), "diratime": ("diratime", False),
}
# Mutually exclusive access-time modes: the last one given wins.
_ATIME = ("noatime", "relatime", "strictatime")
BIND_OPTIONS = frozenset(_PAIRS) | frozenset(_ATIME)

# mount_setattr(2) attributes of the restrictive flags, for copies pycri stages itself.
MOUNT_ATTRS = {"ro": 0x1, "nosuid": 0x2, "nodev": 0x4, "noexec": 0x8}


def option_problem(option: str) -> str | None:
    """Why `option` cannot be a bind-mount option (the gate's check), or None."""
    if option in BIND_OPTIONS:
        return None
    return (f"{option!r} is not a bind-mount option (one of "
            f"{', '.join(sorted(BIND_OPTIONS))})")


def _group(option: str) -> str | None:
    if option in _PAIRS:
        return _PAIRS[option][0]
    return "atime" if option in _ATIME else None


def merge(defaults: Iterable[str], requested: Iterable[str]) -> list[str]:
    """The OCI options of a bind: `defaults` with `requested` merged in (module doc)."""
    order: list[str] = []  # a group name or an option outside every group
    chosen: dict[str, str] = {}
    for option in [*defaults, *requested]:
        key = _group(option) or option
        if key not in chosen:
            order.append(key)
            chosen[key] = option
        elif option in _PAIRS:
            if _PAIRS[option][1]:
                chosen[key] = option
        elif key == "atime":
            chosen[key] = option
    return [chosen[k] for k in order]


def mount_attrs(options: Iterable[str]) -> int:
    """The mount_setattr(2) attributes (MOUNT_ATTRS) that `options` set."""
    attrs = 0
    for option in options:
        attrs |= MOUNT_ATTRS.get(option, 0)
    return attrs
