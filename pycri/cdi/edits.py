"""CDI container edits applied to an OCI spec: a pure function of its inputs.

The edits come from `registry.resolve` in the order the CDI spec gives (for each
requested device: its spec's edits the first time that spec is met, then the
device's), their device nodes already completed from the host. Later edits win:
an env name, a device path or a mount destination set twice keeps the last value.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from pycri.cdi.schema import ContainerEdits, DeviceNode, Mount


def mount_depth(mount: Mapping[str, Any]) -> int:
    """Path components of a mount's destination: parents mount before children."""
    return len([p for p in mount["destination"].split("/") if p])


def _set_env(env: list[str], entry: str) -> None:
    key = entry.partition("=")[0] + "="
    for i, e in enumerate(env):
        if e.startswith(key):
            env[i] = entry
            return
    env.append(entry)


def _device(d: DeviceNode) -> dict[str, Any]:
    if not d.type or d.major is None or d.minor is None:
        raise ValueError(f"CDI device node {d.path} was not completed from the host")
    out: dict[str, Any] = {"path": d.path, "type": d.type, "major": d.major, "minor": d.minor}
    for key, value in (("fileMode", d.file_mode), ("uid", d.uid), ("gid", d.gid)):
        if value is not None:
            out[key] = value
    return out


def _mount(m: Mount) -> dict[str, Any]:
    return {"destination": m.container_path, "source": m.host_path,
            "type": m.type or "bind", "options": list(m.options)}


def apply(doc: Mapping[str, Any], edits: Iterable[ContainerEdits]) -> dict[str, Any]:
    """A new OCI spec: `doc` with `edits` applied in order."""
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    edits = list(edits)
    if not edits:
        return out
    process: dict[str, Any] = out.setdefault("process", {})
    linux: dict[str, Any] = out.setdefault("linux", {})
    for e in edits:
        for var in e.env:
            _set_env(process.setdefault("env", []), var)
        for node in e.device_nodes:
            entry = _device(node)
            devices = [d for d in linux.get("devices", []) if d["path"] != node.path]
            linux["devices"] = [*devices, entry]
            rules = linux.setdefault("resources", {}).setdefault("devices", [])
            rules.append({"allow": True, "type": node.type, "major": node.major,
                          "minor": node.minor, "access": node.permissions or "rwm"})
        for m in e.mounts:
            kept = [x for x in out.get("mounts", []) if x["destination"] != m.container_path]
            out["mounts"] = [*kept, _mount(m)]
        for h in e.hooks:
            hook: dict[str, Any] = {"path": h.path}
            if h.args:
                hook["args"] = list(h.args)
            if h.env:
                hook["env"] = list(h.env)
            if h.timeout is not None:
                hook["timeout"] = h.timeout
            out.setdefault("hooks", {}).setdefault(h.hook_name, []).append(hook)
        if e.additional_gids:
            gids = process.setdefault("user", {}).setdefault("additionalGids", [])
            gids.extend(g for g in dict.fromkeys(e.additional_gids) if g and g not in gids)
        if e.intel_rdt is not None:
            r = e.intel_rdt
            linux["intelRdt"] = {k: v for k, v in (("closID", r.clos_id),
                                                   ("l3CacheSchema", r.l3_cache_schema),
                                                   ("memBwSchema", r.mem_bw_schema)) if v}
    if "mounts" in out:
        out["mounts"].sort(key=mount_depth)
    return out
