"""Device nodes: linux.devices (created in the container) and the device cgroup rules
(linux.resources.devices) that allow exactly them, or every device when privileged."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pycri.devices import DeviceInfo


def _entries(
    devices: Iterable[DeviceInfo],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """linux.devices and the matching device-cgroup allow rules, one per path."""
    nodes: dict[str, dict[str, Any]] = {}
    rules: list[dict[str, Any]] = []
    for d in devices:
        if d.path in nodes:
            continue
        nodes[d.path] = {
            "path": d.path,
            "type": d.type,
            "major": d.major,
            "minor": d.minor,
            "fileMode": d.file_mode,
            "uid": d.uid,
            "gid": d.gid,
        }
        rules.append(
            {
                "allow": True,
                "type": d.type,
                "major": d.major,
                "minor": d.minor,
                "access": d.permissions,
            }
        )
    return list(nodes.values()), rules


def container_devices(
    devices: Sequence[DeviceInfo], host_devices: Sequence[DeviceInfo], privileged: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """linux.devices and linux.resources.devices: the CRI devices behind a deny-all rule;
    a privileged container also gets the host's devices and may use any device."""
    if privileged:
        nodes, _ = _entries([*host_devices, *devices])
        return nodes, [{"allow": True, "access": "rwm"}]
    nodes, rules = _entries(devices)
    return nodes, [{"allow": False, "access": "rwm"}, *rules]
