"""CDI names: `vendor.com/class` kinds and `vendor.com/class=name` device names.

The syntax is the CDI spec's (cncf-tags/container-device-interface, SPEC.md and its
parser rules): vendor and class start with a letter and end with a letter or digit,
with letters, digits, `_`, `-` and `.` between; a device name starts and ends with a
letter or digit and may also hold `:` between. Each check returns what is wrong, or
None, so the CRI gate and the spec-file loader word the same rule the same way.
"""

from __future__ import annotations

import re

ANNOTATION_PREFIX = "cdi.k8s.io/"

# The rules, worded without a value (a spec file's values are not repeated).
KIND_RULE = ("expected vendor/class, each starting with a letter and ending with a letter "
             "or digit, with letters, digits, '_', '-' or '.' between")
DEVICE_RULE = ("expected a device name starting and ending with a letter or digit, with "
               "letters, digits, '_', '-', '.' or ':' between")

_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9_.\-]*[A-Za-z0-9])?")
_DEVICE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:\-]*[A-Za-z0-9])?")


def kind_problem(kind: str) -> str | None:
    """What is wrong with a `vendor/class` kind, or None."""
    vendor, sep, cls = kind.partition("/")
    if not sep or not vendor or not cls:
        return f"kind {kind!r} is not vendor/class"
    if not _VENDOR_OR_CLASS.fullmatch(vendor):
        return f"kind {kind!r}: invalid vendor {vendor!r}"
    if not _VENDOR_OR_CLASS.fullmatch(cls):
        return f"kind {kind!r}: invalid class {cls!r}"
    return None


def device_name_problem(name: str) -> str | None:
    """What is wrong with the name part of a device (after `=`), or None."""
    if not _DEVICE.fullmatch(name):
        return (f"device name {name!r} must start and end with a letter or digit, "
                "with letters, digits, '_', '-', '.' or ':' between")
    return None


def qualified_problem(device: str) -> str | None:
    """What is wrong with a fully qualified `vendor/class=name`, or None."""
    kind, sep, name = device.partition("=")
    if not sep:
        return f"CDI device {device!r} is not vendor.com/class=name"
    problem = kind_problem(kind) or device_name_problem(name)
    return f"CDI device {device!r}: {problem}" if problem else None


def split(device: str) -> tuple[str, str]:
    """(kind, name) of a device the gate already accepted."""
    kind, _, name = device.partition("=")
    return kind, name


def annotation_devices(annotations: dict[str, str]) -> list[str]:
    """Devices asked for by `cdi.k8s.io/<key>` annotations (comma-separated values),
    in key order so the same annotations always inject in the same order."""
    out: list[str] = []
    for key in sorted(annotations):
        if key.startswith(ANNOTATION_PREFIX):
            out.extend(annotations[key].split(","))
    return out
