"""NRI plugins' replies merged in plugin order, one adjustment and one update per container.

At CreateContainer every subscribed plugin may return a `ContainerAdjustment` (changes
to the container being created) and `ContainerUpdate`s (resource changes of other
containers). `merge_adjustments` and `merge_updates` fold the replies in plugin order
into one of each, the way the NRI protocol defines it:

- A key prefixed with '-' removes: an annotation, mount destination, env name, device
  path, namespace type or sysctl. A removal also takes back what an earlier plugin
  added for that key.
- Every field (and every keyed entry: env name, mount destination, rlimit type...) is
  owned by the first plugin that sets it; a second plugin setting it is a conflict,
  `AdjustmentConflict`, naming both plugins and the field. A plugin may set what an
  earlier one only removed if it removed it itself. OCI hooks accumulate instead, and
  args whose first element is "" replace earlier args without a conflict.
- Each plugin's values are checked as they are merged, so a bad value is an
  `AdjustmentError` naming the plugin that sent it.

The merged adjustment becomes the OCI spec in pycri/nri/apply.py, the updates go to
running containers through pycri/nri/resources.py; the event plumbing that collects the
replies is pycri/nri/adaptation.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pycri.nri.api import api_pb2 as api
from pycri.nri.checks import (
    HOOK_KINDS,
    AdjustmentConflict,
    _check_adjustment,
    _check_resources,
    _fail,
    _no_nul,
    _unmark,
)

F = api.Field  # the protocol's names of the owned fields, used in conflict messages


@dataclass
class _Owners:
    """Who set (or removed) each field of each container so far, in plugin order."""

    # (container, field, key) -> (plugin, removed)
    _by: dict[tuple[str, int, str], tuple[str, bool]] = field(default_factory=dict)

    def claim(self, plugin: str, fld: int, key: str = "", cid: str = "") -> None:
        prev = self._by.get((cid, fld, key))
        if prev is not None and prev[0] != plugin:
            what = F.Name(fld) + (f" {key!r}" if key else "")
            if cid:
                what += f" of container {cid}"
            raise AdjustmentConflict(plugin, prev[0], what)
        self._by[(cid, fld, key)] = (plugin, False)

    def clear(self, plugin: str, fld: int, key: str = "") -> None:
        """A removal takes the key back from whoever set it; only its remover may set it again."""
        self._by[("", fld, key)] = (plugin, True)


def _keyed(
    plugin: str,
    owners: _Owners,
    fld: int,
    merged: list[Any],
    entries: Sequence[Any],
    key_of: Callable[[Any], str],
) -> list[Any]:
    """Fold one plugin's list of keyed entries (removals marked '-') into `merged`:
    its removals take back earlier entries of their key and stay as markers (the spec
    may have the key too); its additions replace any earlier entry of their key."""
    removed: dict[str, Any] = {}
    added: dict[str, Any] = {}
    for e in entries:
        key, marked = _unmark(key_of(e))
        (removed if marked else added)[key] = e
    for key in removed:
        owners.clear(plugin, fld, key)
    for key in added:
        owners.claim(plugin, fld, key)
    out = [e for e in merged if _unmark(key_of(e))[0] not in removed.keys() | added.keys()]
    return out + [e for k, e in removed.items() if k not in added] + list(added.values())


def _mapped(
    plugin: str, owners: _Owners, fld: int, merged: dict[str, str], entries: dict[str, str]
) -> None:
    """Fold one plugin's map (removals are '-key' entries) into `merged`."""
    for k in entries:
        key, marked = _unmark(k)
        if marked:
            owners.clear(plugin, fld, key)
            merged.pop(key, None)
            merged["-" + key] = ""
    for k, v in entries.items():
        if not _unmark(k)[1]:
            owners.claim(plugin, fld, k)
            merged[k] = v


_MEMORY_FIELDS = (("limit", F.MemLimit), ("reservation", F.MemReservation),
                  ("swap", F.MemSwapLimit), ("kernel", F.MemKernelLimit),
                  ("kernel_tcp", F.MemTCPLimit), ("swappiness", F.MemSwappiness),
                  ("disable_oom_killer", F.MemDisableOomKiller),
                  ("use_hierarchy", F.MemUseHierarchy))
_CPU_FIELDS = (("shares", F.CPUShares), ("quota", F.CPUQuota), ("period", F.CPUPeriod),
               ("realtime_runtime", F.CPURealtimeRuntime),
               ("realtime_period", F.CPURealtimePeriod))


def _merge_resources(
    plugin: str, owners: _Owners, out: api.LinuxResources, r: api.LinuxResources, cid: str = ""
) -> None:
    for name, fld in _MEMORY_FIELDS:
        if r.memory.HasField(name):
            owners.claim(plugin, fld, cid=cid)
            getattr(out.memory, name).CopyFrom(getattr(r.memory, name))
    for name, fld in _CPU_FIELDS:
        if r.cpu.HasField(name):
            owners.claim(plugin, fld, cid=cid)
            getattr(out.cpu, name).CopyFrom(getattr(r.cpu, name))
    if r.cpu.cpus:
        owners.claim(plugin, F.CPUSetCPUs, cid=cid)
        out.cpu.cpus = r.cpu.cpus
    if r.cpu.mems:
        owners.claim(plugin, F.CPUSetMems, cid=cid)
        out.cpu.mems = r.cpu.mems
    if r.HasField("pids"):
        owners.claim(plugin, F.PidsLimit, cid=cid)
        out.pids.CopyFrom(r.pids)
    for h in r.hugepage_limits:
        owners.claim(plugin, F.HugepageLimits, h.page_size, cid=cid)
        kept = [x for x in out.hugepage_limits if x.page_size != h.page_size]
        del out.hugepage_limits[:]
        out.hugepage_limits.extend([*kept, h])
    for k, v in r.unified.items():
        owners.claim(plugin, F.CgroupsUnified, k, cid=cid)
        out.unified[k] = v
    for name, fld in (("blockio_class", F.BlockioClass), ("rdt_class", F.RdtClass)):
        if r.HasField(name):
            owners.claim(plugin, fld, cid=cid)
            getattr(out, name).CopyFrom(getattr(r, name))
    out.devices.extend(r.devices)  # device rules accumulate, as OCI rules do


@dataclass
class _Merge:
    """The merged adjustment while replies are folded into it."""

    owners: _Owners = field(default_factory=_Owners)
    out: api.ContainerAdjustment = field(default_factory=api.ContainerAdjustment)
    mounts: list[api.Mount] = field(default_factory=list)
    env: list[api.KeyValue] = field(default_factory=list)
    devices: list[api.LinuxDevice] = field(default_factory=list)
    rlimits: dict[str, api.POSIXRlimit] = field(default_factory=dict)
    namespaces: dict[str, api.LinuxNamespace] = field(default_factory=dict)
    cdi: dict[str, api.CDIDevice] = field(default_factory=dict)

    def add(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        o, out, linux = self.owners, self.out, adj.linux
        annotations = dict(out.annotations)
        _mapped(plugin, o, F.Annotations, annotations, dict(adj.annotations))
        out.ClearField("annotations")
        out.annotations.update(annotations)
        self.mounts = _keyed(plugin, o, F.Mounts, self.mounts, adj.mounts,
                             lambda m: m.destination)
        self.env = _keyed(plugin, o, F.Env, self.env, adj.env, lambda e: e.key)
        if adj.args:
            args = list(adj.args)
            if not args[0]:  # "" first: replace whatever an earlier plugin set
                o.clear(plugin, F.Args)
                args = args[1:]
            o.claim(plugin, F.Args)
            del out.args[:]
            out.args.extend(args)
        for name, _ in HOOK_KINDS:
            getattr(out.hooks, name).extend(getattr(adj.hooks, name))
        for r in adj.rlimits:
            o.claim(plugin, F.Rlimits, r.type)
            self.rlimits[r.type] = r
        for c in adj.CDI_devices:
            o.claim(plugin, F.CdiDevices, c.name)
            self.cdi[c.name] = c
        self.devices = _keyed(plugin, o, F.Devices, self.devices, linux.devices,
                              lambda d: d.path)
        if linux.HasField("resources"):
            _merge_resources(plugin, o, out.linux.resources, linux.resources)
        if linux.cgroups_path:
            o.claim(plugin, F.CgroupsPath)
            out.linux.cgroups_path = linux.cgroups_path
        for name, fld in (("oom_score_adj", F.OomScoreAdj), ("io_priority", F.IoPriority),
                          ("seccomp_policy", F.SeccompPolicy), ("scheduler", F.LinuxSched)):
            if linux.HasField(name):
                o.claim(plugin, fld)
                getattr(out.linux, name).CopyFrom(getattr(linux, name))
        for n in linux.namespaces:
            kind, _ = _unmark(n.type)
            o.claim(plugin, F.Namespace, kind)
            self.namespaces[kind] = n
        sysctl = dict(out.linux.sysctl)
        _mapped(plugin, o, F.Sysctl, sysctl, dict(linux.sysctl))
        out.linux.ClearField("sysctl")
        out.linux.sysctl.update(sysctl)
        if linux.HasField("rdt"):
            self._rdt(plugin, linux.rdt)

    def _rdt(self, plugin: str, rdt: api.LinuxRdt) -> None:
        o, out = self.owners, self.out.linux.rdt
        parts = (("clos_id", F.RdtClosID), ("schemata", F.RdtSchemata),
                 ("enable_monitoring", F.RdtEnableMonitoring))
        if rdt.remove:
            for _, fld in parts:
                o.clear(plugin, fld)
            out.Clear()
            out.remove = True
        for name, fld in parts:
            if rdt.HasField(name):
                o.claim(plugin, fld)
                getattr(out, name).CopyFrom(getattr(rdt, name))
                out.remove = False

    def result(self) -> api.ContainerAdjustment:
        out = self.out
        out.mounts.extend(self.mounts)
        out.env.extend(self.env)
        out.rlimits.extend(self.rlimits.values())
        out.CDI_devices.extend(self.cdi.values())
        out.linux.devices.extend(self.devices)
        out.linux.namespaces.extend(self.namespaces.values())
        return out


def merge_adjustments(
    replies: Sequence[tuple[str, api.ContainerAdjustment]],
) -> api.ContainerAdjustment:
    """One adjustment from the plugins' replies, given in plugin order as (name, reply)."""
    m = _Merge()
    for plugin, adj in replies:
        _check_adjustment(plugin, adj)
        m.add(plugin, adj)
    return m.result()


def merge_updates(
    replies: Sequence[tuple[str, Sequence[api.ContainerUpdate]]], *, creating: str = ""
) -> list[api.ContainerUpdate]:
    """One update per container from the plugins' replies, in plugin order; the order of
    first mention is kept. `creating` is the container being created, which plugins
    adjust instead and may not update. Ignoring a failure needs every asker to agree."""
    owners = _Owners()
    merged: dict[str, api.ContainerUpdate] = {}
    for plugin, updates in replies:
        for u in updates:
            _no_nul(plugin, u, "update")
            cid = u.container_id
            if not cid:
                raise _fail(plugin, "a container update without a container_id")
            if cid == creating:
                raise _fail(plugin, f"asked to update container {cid} while it is being "
                                    "created (an adjustment does that)")
            r = u.linux.resources
            _check_resources(plugin, r)
            out = merged.get(cid)
            if out is None:
                out = merged[cid] = api.ContainerUpdate(container_id=cid,
                                                        ignore_failure=u.ignore_failure)
                out.linux.resources.SetInParent()
            out.ignore_failure = out.ignore_failure and u.ignore_failure
            _merge_resources(plugin, owners, out.linux.resources, r, cid)
    return list(merged.values())


def take_update(
    updates: Sequence[api.ContainerUpdate], cid: str
) -> tuple[api.LinuxResources | None, list[api.ContainerUpdate]]:
    """At UpdateContainer: what the plugins changed in the container being updated (to
    put on top of the request with `to_cri_resources`), and the updates of the others."""
    own = next((u.linux.resources for u in updates if u.container_id == cid), None)
    return own, [u for u in updates if u.container_id != cid]
