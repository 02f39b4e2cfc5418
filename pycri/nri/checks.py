"""What an NRI plugin's reply may say, each value checked as the reply is merged.

A bad value is an `AdjustmentError` naming the plugin that sent it (pycri/nri/merge.py
runs these checks on each reply, in plugin order). The protocol's vocabularies (rlimits,
namespaces, device types, hook kinds), the '-' removal marker and `_cri_overlay`, the
CRI's view of NRI resources, live here because the checks need them too: the merge, the
OCI spec (pycri/nri/apply.py) and the update path (pycri/nri/resources.py) all build on
this module, and it on none of them.
"""

from __future__ import annotations

import posixpath

from google.protobuf.message import Message

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument, PycriError
from pycri.gate import check_request
from pycri.nri.api import api_pb2 as api

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


class AdjustmentError(PycriError):
    """An NRI plugin asked for something invalid, or something pycri cannot do."""


class AdjustmentConflict(AdjustmentError):
    """Two plugins set the same field of the same container."""

    def __init__(self, plugin: str, other: str, what: str) -> None:
        super().__init__(f'NRI plugins "{plugin}" and "{other}" both tried to set {what}')
        self.plugins = (other, plugin)
        self.field = what


def _unmark(key: str) -> tuple[str, bool]:
    """The key without its removal marker, and whether it had one."""
    return (key[1:], True) if key.startswith("-") else (key, False)


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
