"""NRI plugins' replies: merged in plugin order, applied to the OCI spec and to resources.

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

`apply_adjustment` turns the merged adjustment into a new OCI spec (a pure function:
the caller's spec is not touched), and `to_cri_resources` puts an NRI `LinuxResources`
on top of a container's CRI resources, for the existing UpdateContainerResources path
(`apply_updates`, which runs the OCI runtime's `update`). All of this lives apart from
the event plumbing (pycri/nri/adaptation.py) so each rule is testable on its own.
"""

from __future__ import annotations

import copy
import functools
import logging
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument, PycriError
from pycri.gate import check_request
from pycri.nri.api import api_pb2 as api
from pycri.nri.domain import Containers
from pycri.oci.spec.resources import resources_to_oci

log = logging.getLogger(__name__)

F = api.Field  # the protocol's names of the owned fields, used in conflict messages

RLIMITS = frozenset(
    "RLIMIT_" + n
    for n in ("AS", "CORE", "CPU", "DATA", "FSIZE", "LOCKS", "MEMLOCK", "MSGQUEUE", "NICE",
              "NOFILE", "NPROC", "RSS", "RTPRIO", "RTTIME", "SIGPENDING", "STACK")
)
NAMESPACES = frozenset(("pid", "network", "mount", "ipc", "uts", "user", "cgroup", "time"))
DEVICE_TYPES = frozenset("cbup")
HOOK_KINDS = (  # NRI Hooks field -> OCI hooks key
    ("prestart", "prestart"),
    ("create_runtime", "createRuntime"),
    ("create_container", "createContainer"),
    ("start_container", "startContainer"),
    ("poststart", "poststart"),
    ("poststop", "poststop"),
)
_I64_MAX = 2**63 - 1

# NRI resource fields the CRI's LinuxContainerResources has no place for: settable at
# create (straight into the OCI spec), but not through the UpdateContainerResources path.
_NOT_IN_CRI = (
    ("memory", "reservation", "memory reservation"),
    ("memory", "kernel", "kernel memory limit"),
    ("memory", "kernel_tcp", "kernel TCP memory limit"),
    ("memory", "swappiness", "memory swappiness"),
    ("memory", "disable_oom_killer", "disable_oom_killer"),
    ("memory", "use_hierarchy", "memory use_hierarchy"),
    ("cpu", "realtime_runtime", "CPU realtime runtime"),
    ("cpu", "realtime_period", "CPU realtime period"),
)


class AdjustmentError(PycriError):
    """An NRI plugin asked for something invalid, or something pycri cannot do."""


class AdjustmentConflict(AdjustmentError):
    """Two plugins set the same field of the same container."""

    def __init__(self, plugin: str, other: str, what: str) -> None:
        super().__init__(f'NRI plugins "{plugin}" and "{other}" both tried to set {what}')
        self.plugins = (other, plugin)
        self.field = what


# ---------------------------------------------------------------- ownership


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


def _unmark(key: str) -> tuple[str, bool]:
    """The key without its removal marker, and whether it had one."""
    return (key[1:], True) if key.startswith("-") else (key, False)


# ---------------------------------------------------------------- checks


def _fail(plugin: str, problem: str) -> AdjustmentError:
    return AdjustmentError(f'NRI plugin "{plugin}": {problem}')


def _no_nul(plugin: str, msg: Message, where: str) -> None:
    """No string anywhere in a reply may carry a NUL: it would be cut short in the runtime."""
    for fd, value in msg.ListFields():
        path = f"{where}.{fd.name}"
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            items = [x for kv in value.items() for x in kv]
        elif fd.is_repeated:
            items = list(value)
        else:
            items = [value]
        for v in items:
            if isinstance(v, Message):
                _no_nul(plugin, v, path)
            elif isinstance(v, str) and "\0" in v:
                raise _fail(plugin, f"{path}: contains a NUL byte")


def _clean(path: str) -> str:
    """A container path as the spec holds it (normpath keeps a leading '//')."""
    return posixpath.normpath(path).replace("//", "/")


def _absolute(plugin: str, what: str, path: str) -> str:
    if not path.startswith("/"):
        raise _fail(plugin, f"{what} {path!r} must be an absolute path")
    return _clean(path)


def _check_mount(plugin: str, m: api.Mount) -> None:
    dest = _absolute(plugin, "mount destination", m.destination)
    if dest == "/":
        raise _fail(plugin, "a mount cannot target the container's /")
    if not m.type and not {"bind", "rbind"} & set(m.options):
        raise _fail(plugin, f"mount {dest}: needs a type or a bind option")
    if (m.type == "bind" or {"bind", "rbind"} & set(m.options)) and not m.source.startswith("/"):
        raise _fail(plugin, f"mount {dest}: bind source {m.source!r} must be an absolute path")


def _check_env(plugin: str, e: api.KeyValue) -> None:
    if not e.key or "=" in e.key:
        raise _fail(plugin, f"invalid environment variable name {e.key!r}")


def _check_device(plugin: str, d: api.LinuxDevice) -> None:
    _absolute(plugin, "device path", d.path)
    if d.type not in DEVICE_TYPES or len(d.type) != 1:
        raise _fail(plugin, f"device {d.path}: type {d.type!r} is not one of c, b, u, p")
    if d.major < 0 or d.minor < 0:
        raise _fail(plugin, f"device {d.path}: negative major/minor {d.major}:{d.minor}")


def _check_rlimit(plugin: str, r: api.POSIXRlimit) -> None:
    if r.type not in RLIMITS:
        raise _fail(plugin, f"unknown rlimit {r.type!r}")
    if r.soft > r.hard:
        raise _fail(plugin, f"rlimit {r.type}: soft limit {r.soft} is above hard limit {r.hard}")


def _check_hooks(plugin: str, hooks: api.Hooks) -> None:
    for name, _ in HOOK_KINDS:
        for h in getattr(hooks, name):
            _absolute(plugin, f"{name} hook path", h.path)
            if h.HasField("timeout") and h.timeout.value <= 0:
                raise _fail(plugin, f"{name} hook {h.path}: timeout must be positive")


def _check_namespace(plugin: str, n: api.LinuxNamespace) -> None:
    kind, _ = _unmark(n.type)
    if kind not in NAMESPACES:
        raise _fail(plugin, f"unknown namespace type {kind!r}")
    if n.path:
        _absolute(plugin, f"{kind} namespace path", n.path)


def _check_cgroups_path(plugin: str, path: str) -> None:
    parts = path.split(":")
    if ".." in path.split("/") or (not path.startswith("/") and len(parts) != 3):
        raise _fail(plugin, f"cgroups path {path!r} is neither an absolute cgroupfs path "
                            "without '..' nor a systemd slice:prefix:name")


def _check_seccomp(plugin: str, s: api.LinuxSeccomp) -> None:
    if not s.default_action:
        raise _fail(plugin, "seccomp policy: default_action must be set")
    for i, sc in enumerate(s.syscalls):
        if not sc.names or not all(sc.names) or not sc.action:
            raise _fail(plugin, f"seccomp policy: syscalls[{i}] needs names and an action")


def _cri_overlay(into: pb.LinuxContainerResources, r: api.LinuxResources) -> None:
    """Put the fields of `r` that the CRI can express on top of `into` (ValueError for a
    number beyond int64)."""
    mem, cpu = r.memory, r.cpu
    if mem.HasField("limit"):
        into.memory_limit_in_bytes = mem.limit.value
        # As NRI does: a new limit without a swap limit leaves no room for swap.
        into.memory_swap_limit_in_bytes = mem.limit.value
    if mem.HasField("swap"):
        into.memory_swap_limit_in_bytes = mem.swap.value
    if cpu.HasField("shares"):
        into.cpu_shares = cpu.shares.value
    if cpu.HasField("quota"):
        into.cpu_quota = cpu.quota.value
    if cpu.HasField("period"):
        into.cpu_period = cpu.period.value
    if cpu.cpus:
        into.cpuset_cpus = cpu.cpus
    if cpu.mems:
        into.cpuset_mems = cpu.mems
    if r.hugepage_limits:
        pages = {h.page_size: h.limit for h in into.hugepage_limits}
        pages.update({h.page_size: h.limit for h in r.hugepage_limits})
        del into.hugepage_limits[:]
        into.hugepage_limits.extend(pb.HugepageLimit(page_size=k, limit=v)
                                    for k, v in pages.items())
    into.unified.update(r.unified)


def _gate(who: str, res: pb.LinuxContainerResources) -> None:
    """The CRI's own rules for the same values (ranges, cpuset and page size syntax)."""
    try:
        check_request(res)
    except InvalidArgument as e:
        raise _fail(who, f"resources: {e}") from None


def _check_resources(plugin: str, r: api.LinuxResources) -> None:
    res = pb.LinuxContainerResources()
    try:
        _cri_overlay(res, r)
    except ValueError as e:
        raise _fail(plugin, f"resources: {e}") from None
    _gate(plugin, res)
    mem, cpu = r.memory, r.cpu
    if mem.HasField("kernel") or mem.HasField("kernel_tcp"):
        raise _fail(plugin, "kernel memory limits are not supported (the kernel dropped them)")
    if mem.HasField("reservation") and mem.reservation.value < 0:
        raise _fail(plugin, f"memory reservation {mem.reservation.value} is negative")
    if mem.HasField("swappiness") and mem.swappiness.value > 100:
        raise _fail(plugin, f"memory swappiness {mem.swappiness.value} is outside 0..100")
    if cpu.HasField("realtime_period") and cpu.realtime_period.value > _I64_MAX:
        raise _fail(plugin, f"cpu realtime period {cpu.realtime_period.value} is too large")
    if r.HasField("pids") and r.pids.limit < -1:
        raise _fail(plugin, f"pids limit {r.pids.limit} is below -1 (unlimited)")
    for d in r.devices:
        if d.type and d.type not in "abc":
            raise _fail(plugin, f"device cgroup rule: type {d.type!r} is not a, b or c")
        if d.access and not set(d.access) <= set("rwm"):
            raise _fail(plugin, f"device cgroup rule: access {d.access!r} is not made of r, w, m")
    if r.HasField("blockio_class") and r.blockio_class.value:
        raise _fail(plugin, f"block I/O class {r.blockio_class.value!r}: pycri has no block "
                            "I/O classes configured")


def _check_adjustment(plugin: str, adj: api.ContainerAdjustment) -> None:
    _no_nul(plugin, adj, "adjust")
    for m in adj.mounts:
        if not _unmark(m.destination)[1]:
            _check_mount(plugin, m)
    for e in adj.env:
        if not _unmark(e.key)[1]:
            _check_env(plugin, e)
    for r in adj.rlimits:
        _check_rlimit(plugin, r)
    _check_hooks(plugin, adj.hooks)
    for c in adj.CDI_devices:
        if not c.name:
            raise _fail(plugin, "a CDI device needs a name")
    if adj.args and not [a for a in adj.args[1:] if a] and not adj.args[0]:
        raise _fail(plugin, "args: an empty command line")
    linux = adj.linux
    for d in linux.devices:
        if not _unmark(d.path)[1]:
            _check_device(plugin, d)
    for n in linux.namespaces:
        _check_namespace(plugin, n)
    if linux.cgroups_path:
        _check_cgroups_path(plugin, linux.cgroups_path)
    if linux.HasField("oom_score_adj") and not -1000 <= linux.oom_score_adj.value <= 1000:
        raise _fail(plugin, f"oom_score_adj {linux.oom_score_adj.value} is outside -1000..1000")
    if linux.HasField("io_priority") and not 0 <= linux.io_priority.priority <= 7:
        raise _fail(plugin, f"I/O priority {linux.io_priority.priority} is outside 0..7")
    if linux.HasField("seccomp_policy"):
        _check_seccomp(plugin, linux.seccomp_policy)
    if linux.HasField("resources"):
        _check_resources(plugin, linux.resources)
    for key in linux.sysctl:
        if not _unmark(key)[0]:
            raise _fail(plugin, "an empty sysctl name")
    if linux.net_devices:
        raise _fail(plugin, "moving network devices into a container is not supported by "
                            "pycri's OCI runtimes")
    if linux.HasField("memory_policy"):
        raise _fail(plugin, "a memory policy is not supported by pycri's OCI runtimes")


# ---------------------------------------------------------------- merging


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


# ---------------------------------------------------------------- the OCI spec


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


# ---------------------------------------------------------------- updates


def to_cri_resources(
    base: pb.LinuxContainerResources, r: api.LinuxResources, who: str = "update"
) -> pb.LinuxContainerResources:
    """`base` with the NRI resources `r` on top, checked by the CRI's own rules, for
    UpdateContainerResources. What the CRI cannot express is refused by name."""
    missing = [label for part, name, label in _NOT_IN_CRI if getattr(r, part).HasField(name)]
    if r.HasField("pids"):
        missing.append("pids limit")
    if r.HasField("blockio_class"):
        missing.append("block I/O class")
    if r.HasField("rdt_class"):
        missing.append("RDT class")
    if r.devices:
        missing.append("device cgroup rules")
    if missing:
        raise AdjustmentError(f"NRI {who}: {', '.join(missing)} cannot be changed on a "
                              "running container by pycri")
    out = pb.LinuxContainerResources()
    out.CopyFrom(base)
    try:
        _cri_overlay(out, r)
        check_request(out)
    except (InvalidArgument, ValueError) as e:
        raise AdjustmentError(f"NRI {who}: resources: {e}") from None
    return out


async def apply_updates(
    containers: Containers, updates: Sequence[api.ContainerUpdate]
) -> list[api.ContainerUpdate]:
    """Apply each update through the UpdateContainerResources path (the OCI runtime's
    `update`); return the ones that failed, except those whose asker ignores failure.

    One container's failure does not stop the others': there is no undoing what the
    runtime already changed in another container's cgroup.
    """
    failed: list[api.ContainerUpdate] = []
    for u in updates:
        try:
            await containers.change_resources(u.container_id, functools.partial(
                to_cri_resources, r=u.linux.resources,
                who=f"update of container {u.container_id}"))
        except PycriError as e:
            log.warning("NRI update of container %s failed: %s", u.container_id, e)
            if not u.ignore_failure:
                failed.append(u)
    return failed
