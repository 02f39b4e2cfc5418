"""A merged NRI adjustment applied to an OCI spec.

`apply_adjustment` turns the adjustment `merge_adjustments` (pycri/nri/merge.py)
returned into a new OCI spec, a pure function: the caller's spec is not touched, and
each rule is testable on its own, apart from the event plumbing
(pycri/nri/adaptation.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.nri.api import api_pb2 as api
from pycri.nri.checks import HOOK_KINDS, AdjustmentError, _clean, _cri_overlay, _unmark
from pycri.oci.spec.resources import resources_to_oci


def _oci_mount(m: api.Mount) -> dict[str, Any]:
    kind = m.type or "bind"
    return {"destination": _clean(m.destination),
            "type": kind, "source": m.source, "options": list(m.options)}


def _apply_mounts(doc: dict[str, Any], mounts: Sequence[api.Mount]) -> None:
    current: list[dict[str, Any]] = doc.setdefault("mounts", [])
    for m in mounts:
        dest, marked = _unmark(m.destination)
        dest = _clean(dest)
        current = [x for x in current if x["destination"] != dest]
        if marked:
            continue
        current.append(_oci_mount(m))
        linux = doc.setdefault("linux", {})
        if "rshared" in m.options:
            linux["rootfsPropagation"] = "rshared"
        elif "rslave" in m.options and linux.get("rootfsPropagation") != "rshared":
            linux["rootfsPropagation"] = "rslave"
    # Parents before children, as the spec generator orders them (the sort is stable).
    doc["mounts"] = sorted(current, key=lambda x: len([p for p in x["destination"].split("/")
                                                        if p]))


def _apply_env(process: dict[str, Any], env: Sequence[api.KeyValue]) -> None:
    current: dict[str, str] = {}
    for entry in process.get("env", []):
        key, _, value = entry.partition("=")
        current[key] = value
    for e in env:
        key, marked = _unmark(e.key)
        if marked:
            current.pop(key, None)
        else:
            current[key] = e.value  # keeps the position of a variable it replaces
    process["env"] = [f"{k}={v}" for k, v in current.items()]


def _oci_hook(h: api.Hook) -> dict[str, Any]:
    out: dict[str, Any] = {"path": h.path}
    if h.args:
        out["args"] = list(h.args)
    if h.env:
        out["env"] = list(h.env)
    if h.HasField("timeout"):
        out["timeout"] = h.timeout.value
    return out


def _device_access(d: api.LinuxDevice) -> str:
    if not d.HasField("file_mode"):
        return "rwm"
    perm = d.file_mode.value & 0o777
    return ("r" if perm & 0o444 else "") + ("w" if perm & 0o222 else "") + "m"


def _apply_devices(linux: dict[str, Any], devices: Sequence[api.LinuxDevice]) -> None:
    nodes: list[dict[str, Any]] = linux.setdefault("devices", [])
    rules: list[dict[str, Any]] = linux.setdefault("resources", {}).setdefault("devices", [])
    for d in devices:
        path, marked = _unmark(d.path)
        for old in [n for n in nodes if n["path"] == path]:
            nodes.remove(old)
            rules[:] = [r for r in rules if not (r.get("allow") and r.get("type") == old["type"]
                                                 and r.get("major") == old["major"]
                                                 and r.get("minor") == old["minor"])]
        if marked:
            continue
        node: dict[str, Any] = {"path": path, "type": d.type, "major": d.major, "minor": d.minor}
        if d.HasField("file_mode"):
            node["fileMode"] = d.file_mode.value
        if d.HasField("uid"):
            node["uid"] = d.uid.value
        if d.HasField("gid"):
            node["gid"] = d.gid.value
        nodes.append(node)
        rules.append({"allow": True, "type": d.type, "major": d.major, "minor": d.minor,
                      "access": _device_access(d)})


def _apply_resources(linux: dict[str, Any], r: api.LinuxResources) -> None:
    res: dict[str, Any] = linux.setdefault("resources", {})
    cri = pb.LinuxContainerResources()
    _cri_overlay(cri, r)
    oci = resources_to_oci(cri)
    mem, cpu = r.memory, r.cpu
    memory = {**res.get("memory", {}), **oci.get("memory", {})}
    for name, key in (("reservation", "reservation"), ("swappiness", "swappiness"),
                      ("disable_oom_killer", "disableOOMKiller"),
                      ("use_hierarchy", "useHierarchy")):
        if mem.HasField(name):
            memory[key] = getattr(mem, name).value
    cpus = {**res.get("cpu", {}), **oci.get("cpu", {})}
    for name, key in (("realtime_runtime", "realtimeRuntime"),
                      ("realtime_period", "realtimePeriod")):
        if cpu.HasField(name):
            cpus[key] = getattr(cpu, name).value
    for part, value in (("memory", memory), ("cpu", cpus)):
        if value:
            res[part] = value
    if r.hugepage_limits:
        pages = {h["pageSize"]: h["limit"] for h in res.get("hugepageLimits", [])}
        pages.update({h.page_size: h.limit for h in r.hugepage_limits})
        res["hugepageLimits"] = [{"pageSize": k, "limit": v} for k, v in pages.items()]
    if r.unified:
        res["unified"] = {**res.get("unified", {}), **r.unified}
    if r.HasField("pids"):
        res["pids"] = {"limit": r.pids.limit}
    for d in r.devices:
        rule: dict[str, Any] = {"allow": d.allow, "type": d.type or "a",
                                "access": d.access or "rwm"}
        if d.HasField("major"):
            rule["major"] = d.major.value
        if d.HasField("minor"):
            rule["minor"] = d.minor.value
        res.setdefault("devices", []).append(rule)
    if r.HasField("blockio_class"):  # only "" gets here (merge refuses a class)
        res.pop("blockIO", None)
    if r.HasField("rdt_class"):
        if r.rdt_class.value:
            linux["intelRdt"] = {"closID": r.rdt_class.value}
        else:
            linux.pop("intelRdt", None)


def _apply_rdt(linux: dict[str, Any], rdt: api.LinuxRdt) -> None:
    if rdt.remove:
        linux.pop("intelRdt", None)
    out = linux.get("intelRdt", {})
    if rdt.HasField("clos_id"):
        out["closID"] = rdt.clos_id.value
    if rdt.HasField("schemata"):
        out["schemata"] = list(rdt.schemata.value)
    if rdt.HasField("enable_monitoring"):
        out["enableMonitoring"] = rdt.enable_monitoring.value
    if out:
        linux["intelRdt"] = out


def _oci_seccomp(s: api.LinuxSeccomp) -> dict[str, Any]:
    out: dict[str, Any] = {"defaultAction": s.default_action}
    if s.HasField("default_errno"):
        out["defaultErrnoRet"] = s.default_errno.value
    if s.architectures:
        out["architectures"] = list(s.architectures)
    if s.flags:
        out["flags"] = list(s.flags)
    if s.listener_path:
        out["listenerPath"] = s.listener_path
    if s.listener_metadata:
        out["listenerMetadata"] = s.listener_metadata
    calls = []
    for sc in s.syscalls:
        call: dict[str, Any] = {"names": list(sc.names), "action": sc.action}
        if sc.HasField("errno_ret"):
            call["errnoRet"] = sc.errno_ret.value
        if sc.args:
            call["args"] = [{"index": a.index, "value": a.value, "valueTwo": a.value_two,
                             "op": a.op} for a in sc.args]
        calls.append(call)
    out["syscalls"] = calls
    return out


def _oci_scheduler(s: api.LinuxScheduler) -> dict[str, Any]:
    out: dict[str, Any] = {"policy": api.LinuxSchedulerPolicy.Name(s.policy)}
    for name in ("nice", "priority", "runtime", "deadline", "period"):
        if value := getattr(s, name):
            out[name] = value
    if s.flags:
        out["flags"] = [api.LinuxSchedulerFlag.Name(f) for f in s.flags]
    return out


def _apply_namespaces(linux: dict[str, Any], namespaces: Sequence[api.LinuxNamespace]) -> None:
    current: list[dict[str, str]] = linux.setdefault("namespaces", [])
    for n in namespaces:
        kind, marked = _unmark(n.type)
        entry = {"type": kind, **({"path": n.path} if n.path else {})}
        at = next((i for i, x in enumerate(current) if x["type"] == kind), None)
        if marked:
            if at is not None:
                del current[at]
        elif at is None:
            current.append(entry)
        else:
            current[at] = entry


CDIResolver = Callable[[dict[str, Any], list[str]], dict[str, Any]]


def apply_adjustment(
    doc: dict[str, Any], adj: api.ContainerAdjustment, *, cdi: CDIResolver | None = None
) -> dict[str, Any]:
    """A new OCI spec: `doc` with `adj` (what `merge_adjustments` returned) applied.

    CDI device names need a resolver (`cdi(spec, names) -> spec`); without one they
    are an error naming them, never silently dropped.
    """
    out = copy.deepcopy(doc)
    process: dict[str, Any] = out.setdefault("process", {})
    linux: dict[str, Any] = out.setdefault("linux", {})
    annotations: dict[str, str] = out.setdefault("annotations", {})
    for k in adj.annotations:
        key, marked = _unmark(k)
        if marked:
            annotations.pop(key, None)
    annotations.update({k: v for k, v in adj.annotations.items() if not _unmark(k)[1]})
    _apply_env(process, adj.env)
    if adj.args:
        process["args"] = list(adj.args)
    for name, key in HOOK_KINDS:
        if hooks := getattr(adj.hooks, name):
            out.setdefault("hooks", {}).setdefault(key, []).extend(_oci_hook(h) for h in hooks)
    if adj.CDI_devices:
        names = [c.name for c in adj.CDI_devices]
        if cdi is None:
            raise AdjustmentError(f"NRI plugins asked for CDI devices {', '.join(names)}, but "
                                  "pycri has no CDI registry to resolve them")
        out = cdi(out, names)
        process, linux = out.setdefault("process", {}), out.setdefault("linux", {})
    _apply_devices(linux, adj.linux.devices)
    lx = adj.linux
    if lx.cgroups_path:
        linux["cgroupsPath"] = lx.cgroups_path
    if lx.HasField("oom_score_adj"):
        process["oomScoreAdj"] = lx.oom_score_adj.value
    if lx.HasField("io_priority"):
        klass = getattr(lx.io_priority, "class")  # a Python keyword
        if klass == api.IOPRIO_CLASS_NONE:
            process.pop("ioPriority", None)
        else:
            process["ioPriority"] = {"class": api.IOPrioClass.Name(klass),
                                     "priority": lx.io_priority.priority}
    if lx.HasField("scheduler"):
        if lx.scheduler.policy == api.SCHED_NONE:
            process.pop("scheduler", None)
        else:
            process["scheduler"] = _oci_scheduler(lx.scheduler)
    if lx.HasField("seccomp_policy"):
        linux["seccomp"] = _oci_seccomp(lx.seccomp_policy)
    _apply_namespaces(linux, lx.namespaces)
    if lx.sysctl:
        sysctl: dict[str, str] = linux.setdefault("sysctl", {})
        for k in lx.sysctl:
            key, marked = _unmark(k)
            if marked:
                sysctl.pop(key, None)
        sysctl.update({k: v for k, v in lx.sysctl.items() if not _unmark(k)[1]})
    if lx.HasField("resources"):
        _apply_resources(linux, lx.resources)
    if lx.HasField("rdt"):
        _apply_rdt(linux, lx.rdt)
    if adj.mounts:
        _apply_mounts(out, adj.mounts)
    if adj.rlimits:
        limits = {r["type"]: r for r in process.get("rlimits", [])}
        limits.update({r.type: {"type": r.type, "soft": r.soft, "hard": r.hard}
                       for r in adj.rlimits})
        process["rlimits"] = list(limits.values())
    return out
