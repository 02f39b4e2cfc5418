"""The one gate every CRI request passes before any work starts.

`check_request` walks a request by its protobuf descriptor and raises
`InvalidArgument` naming the offending field by its dotted path
(`config.metadata.name: contains a NUL byte`). Only syntax is checked here:
whether a pod exists, an image is pulled or a host path is there is the
managers' business. Keeping every syntactic rule in this table means a new RPC
is covered the day it is added, and a value that reaches a path, an
environment variable, CNI_ARGS or a runtime call is known to be well formed.

Rules, most general first:
- every string: no NUL; no other C0 control character or DEL, except in free
  text (command lines, annotation values, registry credentials), which the
  Kubernetes API lets carry any of them; a length bound by kind
  (names 253, IDs 128, hostnames 64, paths 4096, free text 1 MiB, others 16 KiB);
- every enum holds a value the CRI defines; every repeated field and map has at
  most 10,000 entries (env vars 1,000,000); labels and annotations at most 512 KiB
  each in total;
- integer ranges where the kernel or the CRI has them;
- per field: names, IDs, hostnames, log paths, mount and device paths, sysctl names,
  host IPs; per message: rules across fields (a host port needs a container port);
- per request: what must be set for the RPC to mean anything.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from pycri.api.api_pb2 import CONTAINER, NODE, POD, TARGET
from pycri.cdi import names as cdi_names
from pycri.errors import InvalidArgument
from pycri.oci.bindopts import option_problem
from pycri.oci.spec.resources import MAX_CPU_QUOTA

MAX_ITEMS = 10_000
# A kubelet turns every Service of a namespace into 7 env vars (enableServiceLinks, on by
# default): 1,500 Services make 10,500. Their size stays bound by gRPC's message limit.
MAX_ITEMS_OF: dict[tuple[str, str], int] = {("ContainerConfig", "envs"): 1_000_000}
# Kubernetes caps a pod's annotations at 256 KiB; the kubelet adds its own keys on top.
MAX_MAP_BYTES = 512 * 1024
SIZED_MAPS = ("labels", "annotations")
MIN_MEMORY = os.sysconf("SC_PAGE_SIZE")  # below one page the limit rounds to nothing
NAME_MAX = 255  # bytes in one path component (the kernel's limit)
HOST_NAME_MAX = 64  # bytes sethostname(2) takes; the kubelet's FQDN limit too
UID_MAX = 2**32 - 2  # (uid_t)-1 means "unchanged" to the kernel

Problem = str | None  # what is wrong with a value, or None when it is fine
Check = Callable[[Any], Problem]


@dataclass(frozen=True)
class Kind:
    """How a string field is checked."""

    max_len: int = 16 * 1024
    free_text: bool = False  # only NUL refused: execve, JSON and the API take the rest
    check: Check | None = None


_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_HOST_LABEL_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_\-]*[A-Za-z0-9])?")
_SYSCTL_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]*")
_CPUSET_RE = re.compile(r"\d{1,5}(-\d{1,5})?(,\d{1,5}(-\d{1,5})?)*")
_PAGE_SIZE_RE = re.compile(r"\d{1,4}[KMGT]B")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NUL = re.compile(r"\x00")  # free text: any other character is an argument or a value
_CGROUP_FILE_RE = re.compile(r"(cpu|cpuset|io|memory|pids|hugetlb|rdma|misc)\.[a-z0-9_.]+")


def _name(value: str) -> Problem:
    """Metadata names end up in paths, name keys, log names and CNI_ARGS."""
    if value in (".", ".."):
        return f"{value!r} is not a name"
    bad = sorted({c for c in value if c in "/;="})
    return f"may not contain {' '.join(bad)!r}" if bad else None


def _id(value: str) -> Problem:
    """Container and pod IDs (or their prefixes) name runtime state and directories."""
    if value and not _ID_RE.fullmatch(value):
        return "must be letters, digits, '_', '.' or '-' (an ID or an ID prefix)"
    return None


def _hostname(value: str) -> Problem:
    """What sethostname(2) takes (64 bytes) in the forms a kubelet builds: a pod name or
    `hostname` label, or with `setHostnameAsFQDN` `<name>.<subdomain>.<ns>.svc.<domain>`,
    which ends in '.' when the cluster domain is empty. Labels as RFC 1123 (plus '_',
    which crictl examples use); no space or control byte, as the name is written into
    /etc/hostname and /etc/hosts."""
    labels = value[:-1].split(".") if value.endswith(".") else value.split(".")
    if value and not all(_HOST_LABEL_RE.fullmatch(label) for label in labels):
        return ("must be dot-separated labels of letters, digits, '-' and '_', each "
                "starting and ending with a letter or digit, with at most one final '.'")
    return None


def _normalised(value: str) -> bool:
    return os.path.normpath(value) == value and not value.startswith("//")


def _long_component(value: str) -> Problem:
    if any(len(part.encode()) > NAME_MAX for part in value.split("/")):
        return f"has a path component longer than {NAME_MAX} bytes"
    return None


def _absolute_path(value: str) -> Problem:
    if value and not value.startswith("/"):
        return "must be an absolute path"
    if ".." in value.split("/"):
        return "may not contain '..'"
    return _long_component(value)


def _container_path(value: str) -> Problem:
    """A path inside the container: absolute; `..` cannot climb above its `/` and the
    spec builder normalises it (the kubelet passes `/data/../cache` as the pod spec has
    it)."""
    if value and not value.startswith("/"):
        return "must be an absolute path"
    return _long_component(value)


def _log_directory(value: str) -> Problem:
    if value and not (value.startswith("/") and _normalised(value)):
        return "must be an absolute, normalised path (no '.', '..', '//' or trailing '/')"
    return _long_component(value)


def _cgroup_parent(value: str) -> Problem:
    if ".." in value.split("/"):
        return "may not contain '..'"
    return _long_component(value)


def _archive_path(value: str) -> Problem:
    """A checkpoint archive's file: the daemon's working directory means nothing to a client."""
    if value and not (value.startswith("/") and _normalised(value) and value != "/"):
        return ("must be an absolute, normalised path naming a file (no '.', '..', '//' "
                "or trailing '/')")
    return _long_component(value)


def _log_path(value: str) -> Problem:
    """Relative to the pod's log_directory, and staying inside it."""
    if not value:
        return None
    if value.startswith("/"):
        return "must be relative to the pod's log_directory"
    if not _normalised(value) or value.split("/")[0] in (".", ".."):
        return "must stay inside the pod's log_directory (normalised, no '.' or '..')"
    return _long_component(value)


def _cgroup_file(value: str) -> Problem:
    """`unified` keys name a file in the cgroup v2 directory pycri or the runtime writes:
    a controller's interface file, never cgroup.procs or a path."""
    if not _CGROUP_FILE_RE.fullmatch(value) or ".." in value:
        return "is not a cgroup v2 controller file (like memory.oom.group)"
    return None


def _sysctl(value: str) -> Problem:
    if not _SYSCTL_RE.fullmatch(value) or ".." in value.split("/") or "//" in value:
        return "is not a sysctl name (like net.ipv4.ip_forward)"
    return None


def _cpuset(value: str) -> Problem:
    if value and not _CPUSET_RE.fullmatch(value):
        return "is not a CPU or memory-node list (like 0-3,8)"
    return None


def _page_size(value: str) -> Problem:
    if not _PAGE_SIZE_RE.fullmatch(value):
        return "is not a huge page size (like 2MB or 1GB)"
    return None


def _ip(value: str) -> Problem:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return "is not an IP address"
    return None


NAME = Kind(max_len=253, check=_name)
ID = Kind(max_len=128, check=_id)
PATH = Kind(max_len=4096, check=_absolute_path)
CONTAINER_PATH = Kind(max_len=4096, check=_container_path)
FREE_TEXT = Kind(max_len=1024 * 1024, free_text=True)
ANNOTATION_VALUE = Kind(max_len=MAX_MAP_BYTES, free_text=True)
DEFAULT = Kind()

# (message, field) -> kind; a map's keys and values are "<field>.key" / "<field>.value".
KINDS: dict[tuple[str, str], Kind] = {
    ("PodSandboxMetadata", "name"): NAME,
    ("PodSandboxMetadata", "namespace"): NAME,
    ("PodSandboxMetadata", "uid"): NAME,
    ("ContainerMetadata", "name"): NAME,
    ("PodSandboxConfig", "hostname"): Kind(max_len=HOST_NAME_MAX, check=_hostname),
    ("PodSandboxConfig", "log_directory"): Kind(max_len=4096, check=_log_directory),
    ("ContainerConfig", "log_path"): Kind(max_len=4096, check=_log_path),
    ("ContainerConfig", "working_dir"): CONTAINER_PATH,
    ("ContainerConfig", "command"): FREE_TEXT,
    ("ContainerConfig", "args"): FREE_TEXT,
    ("ExecSyncRequest", "cmd"): FREE_TEXT,
    ("ExecRequest", "cmd"): FREE_TEXT,
    ("Mount", "container_path"): CONTAINER_PATH,
    ("Mount", "host_path"): PATH,
    # Only per-mount flags a bind can be remounted with (oci/bindopts.py).
    ("Mount", "mount_options"): Kind(max_len=32, check=option_problem),
    ("Device", "container_path"): PATH,
    ("Device", "host_path"): PATH,
    # CDI device names: vendor.com/class=name (the CDI spec's syntax, cdi/names.py).
    ("CDIDevice", "name"): Kind(max_len=1024, check=cdi_names.qualified_problem),
    ("PortMapping", "host_ip"): Kind(max_len=64, check=_ip),
    ("LinuxPodSandboxConfig", "cgroup_parent"): Kind(max_len=4096, check=_cgroup_parent),
    ("LinuxContainerSecurityContext", "readonly_paths"): PATH,
    ("LinuxContainerSecurityContext", "masked_paths"): PATH,
    ("LinuxContainerResources", "cpuset_cpus"): Kind(max_len=4096, check=_cpuset),
    ("LinuxContainerResources", "cpuset_mems"): Kind(max_len=4096, check=_cpuset),
    ("LinuxContainerResources", "unified.key"): Kind(max_len=64, check=_cgroup_file),
    ("PodOverhead", "unified.key"): Kind(max_len=64, check=_cgroup_file),
    ("HugepageLimit", "page_size"): Kind(max_len=16, check=_page_size),
    ("LinuxPodSandboxConfig", "sysctls.key"): Kind(max_len=253, check=_sysctl),
    ("ImageSpec", "image"): Kind(max_len=1024),
    ("ImageSpec", "user_specified_image"): Kind(max_len=1024),
    ("ImageSpec", "image_ref"): Kind(max_len=1024),
    ("AuthConfig", "username"): FREE_TEXT,
    ("AuthConfig", "password"): FREE_TEXT,
    ("AuthConfig", "auth"): FREE_TEXT,
    ("AuthConfig", "identity_token"): FREE_TEXT,
    ("AuthConfig", "registry_token"): FREE_TEXT,
    # Checkpoint archives: files pycri writes or reads, so absolute paths naming a file.
    ("CheckpointContainerRequest", "location"): Kind(max_len=4096, check=_archive_path),
    ("CheckpointPodRequest", "output_path"): Kind(max_len=4096, check=_archive_path),
    ("RestorePodRequest", "checkpoint_path"): Kind(max_len=4096, check=_archive_path),
    ("CheckpointPodRequest", "container_ids"): ID,
}
ID_FIELDS = ("container_id", "pod_sandbox_id", "target_id")
FILTERS_WITH_IDS = ("ContainerFilter", "PodSandboxFilter", "ContainerStatsFilter",
                    "PodSandboxStatsFilter")


@functools.cache
def _kind(message: str, field: str) -> Kind:
    kind = KINDS.get((message, field))
    if kind is not None:
        return kind
    if field in ID_FIELDS or (message in FILTERS_WITH_IDS and field == "id"):
        return ID
    if field.endswith(".value") and field.split(".")[0] == "annotations":
        return ANNOTATION_VALUE
    return DEFAULT


def _between(lo: int, hi: int, *also: int) -> Check:
    def check(v: int) -> Problem:
        if lo <= v <= hi or v in also:
            return None
        extra = f" (or {', '.join(map(str, also))})" if also else ""
        return f"{v} is outside {lo}..{hi}{extra}"

    return check


_I64_MAX = 2**63 - 1
_UID = _between(0, UID_MAX)
_PORT = _between(0, 65535)
_NON_NEGATIVE = _between(0, _I64_MAX)

# (message, field) -> check of each integer (of an Int64Value's value for wrapper fields).
RANGES: dict[tuple[str, str], Check] = {
    ("LinuxContainerResources", "oom_score_adj"): _between(-1000, 1000),
    ("LinuxContainerResources", "cpu_shares"): _between(0, 262144),
    # The kernel takes CFS periods of 1 ms..1 s and quotas of 1 ms..2^44-1 µs (EINVAL
    # above, found by the RPC fuzzer); 0 is unset, -1 unlimited.
    ("LinuxContainerResources", "cpu_period"): _between(1000, 1_000_000, 0),
    ("LinuxContainerResources", "cpu_quota"): _between(1000, MAX_CPU_QUOTA, 0, -1),
    # At least a page. A limit the runtime cannot start a container in (1-2 MiB with runc
    # here) is refused by it, as InvalidArgument with the kernel's words; 4 MiB runs, and
    # the API lets a pod ask for it, so no higher floor is the gate's to set (issue 25).
    ("LinuxContainerResources", "memory_limit_in_bytes"): _between(MIN_MEMORY, _I64_MAX, 0),
    ("LinuxContainerResources", "memory_swap_limit_in_bytes"): _between(-1, _I64_MAX),
    ("PortMapping", "container_port"): _PORT,
    ("PortMapping", "host_port"): _PORT,
    ("PortForwardRequest", "port"): _between(1, 65535),
    ("StopContainerRequest", "timeout"): _NON_NEGATIVE,
    ("ExecSyncRequest", "timeout"): _NON_NEGATIVE,
    ("CheckpointContainerRequest", "timeout"): _NON_NEGATIVE,
    ("LinuxContainerSecurityContext", "run_as_user"): _UID,
    ("LinuxContainerSecurityContext", "run_as_group"): _UID,
    ("LinuxContainerSecurityContext", "supplemental_groups"): _UID,
    ("LinuxSandboxSecurityContext", "run_as_user"): _UID,
    ("LinuxSandboxSecurityContext", "run_as_group"): _UID,
    ("LinuxSandboxSecurityContext", "supplemental_groups"): _UID,
}
# A handler's overhead is what it uses itself, however small: no memory floor.
RANGES.update({("PodOverhead", f): RANGES[("LinuxContainerResources", f)]
               for f in ("cpu_shares", "cpu_period", "cpu_quota")})
RANGES[("PodOverhead", "memory_limit_in_bytes")] = _NON_NEGATIVE

# (message, field) -> the rule name a sub-message reached through that field is checked
# by, where it means something else there than its type does elsewhere.
CHECKED_AS: dict[tuple[str, str], str] = {
    ("LinuxPodSandboxConfig", "overhead"): "PodOverhead",
    ("UpdatePodSandboxResourcesRequest", "overhead"): "PodOverhead",
}

def _port_mapping(pm: Any) -> Problem:
    if pm.host_port and not pm.container_port:
        return "container_port: must be set when host_port is"
    return None


def _root(path: str) -> bool:
    return bool(path) and os.path.normpath(path).lstrip("/") == ""


# The files a bind may cover inside the container's own procfs (the lxcfs set, which
# runc and crun also accept); a bind anywhere else under /proc is refused by the OCI
# runtime at start, after the container was made, as an opaque error.
PROC_BIND_FILES = frozenset(
    f"/proc/{name}"
    for name in ("cpuinfo", "diskstats", "meminfo", "stat", "swaps", "uptime", "loadavg",
                 "slabinfo", "net/dev")
)


def _mount(m: Any) -> Problem:
    if not m.container_path or _root(m.container_path):
        return "container_path: must name a path inside the container, not its root"
    path = os.path.normpath(m.container_path)
    if (path == "/proc" or path.startswith("/proc/")) and path not in PROC_BIND_FILES:
        return ("container_path: /proc is the container's own procfs; a bind may cover only "
                + ", ".join(sorted(PROC_BIND_FILES)))
    return None


def _device(d: Any) -> Problem:
    if not d.host_path:
        return "host_path: must name the host's device (or a directory of devices)"
    if _root(d.host_path) or _root(d.container_path):
        return "a device path may not be '/'"
    return None


def _cdi_annotations(config: Any) -> Problem:
    """`cdi.k8s.io/<key>` annotations ask for CDI devices: comma-separated device names."""
    for key, value in config.annotations.items():
        if key.startswith(cdi_names.ANNOTATION_PREFIX):
            for device in value.split(","):
                if problem := cdi_names.qualified_problem(device):
                    return f"annotations[{key[:64]!r}]: {problem}"
    return None


def _resources(r: Any) -> Problem:
    swap, memory = r.memory_swap_limit_in_bytes, r.memory_limit_in_bytes
    if swap > 0 and not memory:
        return "memory_swap_limit_in_bytes: needs memory_limit_in_bytes"
    if swap > 0 and swap < memory:
        return ("memory_swap_limit_in_bytes: counts memory too, so must not be below "
                "memory_limit_in_bytes")
    return None


# Sysctls a pod may set, by the namespace that makes them its own (as runc decides).
_IPC_SYSCTLS = ("kernel.sem", "kernel.shm", "kernel.msg", "fs.mqueue.")
_UTS_SYSCTLS = ("kernel.hostname", "kernel.domainname")


def _pod_sysctls(linux: Any) -> Problem:
    ns = linux.security_context.namespace_options
    for key in linux.sysctls:
        name = key.replace("/", ".")
        if name.startswith(_IPC_SYSCTLS):
            shared = ns.ipc == NODE
        elif name.startswith("net."):
            shared = ns.network == NODE
        elif name in _UTS_SYSCTLS:
            shared = ns.network == NODE  # the pod's UTS namespace goes with its network's
        else:
            return f"sysctls[{key[:64]!r}]: is not a namespaced sysctl (net.*, kernel.shm*, " \
                "kernel.msg*, kernel.sem, fs.mqueue.*); a pod cannot set it"
        if shared:
            return f"sysctls[{key[:64]!r}]: would change the host's, since the pod shares " \
                "that namespace with the node"
    return None


# What a pod's cgroup takes: the values the kubelet computes for a pod (and containerd's
# sandbox annotations carry), with `unified` (memory.oom.group=1 from a kubelet >= 1.32 on
# cgroup v2); anything else would be silently dropped.
POD_LEVEL_RESOURCES = ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes",
                       "unified")


def _pod_resources(linux: Any) -> Problem:
    for name in ("overhead", "resources"):
        for f, _ in getattr(linux, name).ListFields():
            if f.name not in POD_LEVEL_RESOURCES:
                return (f"{name}.{f.name}: a pod-level limit can only be one of "
                        f"{', '.join(POD_LEVEL_RESOURCES)}")
    return None


def _pod_linux(linux: Any) -> Problem:
    return _pod_sysctls(linux) or _pod_resources(linux)
def _id_maps(where: str, maps: Any) -> Problem:
    """IDs mapped past 2^32-1 would wrap; host ID 0 is the host's root."""
    for i, m in enumerate(maps):
        if not m.length:
            return f"{where}[{i}].length: must be at least 1"
        if m.host_id + m.length - 1 > UID_MAX or m.container_id + m.length - 1 > UID_MAX:
            return f"{where}[{i}]: maps IDs past {UID_MAX}"
        if m.host_id == 0:
            return f"{where}[{i}].host_id: 0 would map the host's root into the pod"
    return None


def _userns(u: Any) -> Problem:
    """What pycri can honour: the host's user namespace (NODE), or one for the pod (POD)
    with one uid and one gid mapping that both map container ID 0, as the kubelet sends."""
    if u.mode in (CONTAINER, TARGET):
        return ("mode: a user namespace per container (CONTAINER, TARGET) is not "
                "supported; use POD (one for the pod) or NODE (the host's)")
    if u.mode == NODE:
        return "uids: mappings need mode POD" if (u.uids or u.gids) else None
    if len(u.uids) != 1 or len(u.gids) != 1:
        return (f"mode POD needs exactly one uid and one gid mapping (got {len(u.uids)} and "
                f"{len(u.gids)})")
    if u.uids[0].container_id != 0 or u.gids[0].container_id != 0:
        return "mode POD needs container ID 0 mapped (uids[0] and gids[0] must start at 0)"
    if u.uids[0].length != u.gids[0].length:
        return (f"uid and gid mappings must have the same shape (lengths {u.uids[0].length} "
                f"and {u.gids[0].length})")
    return _id_maps("uids", u.uids) or _id_maps("gids", u.gids)


def _own_userns(ns: Any) -> bool:
    return ns.HasField("userns_options") and ns.userns_options.mode == POD


def _namespaces(ns: Any) -> Problem:
    """A pod in its own user namespace cannot share the host's network, PID or IPC
    namespace (Kubernetes forbids hostUsers: false with them)."""
    if not _own_userns(ns):
        return None
    for name in ("network", "pid", "ipc"):
        if getattr(ns, name) == NODE:
            return f"{name}: a pod with its own user namespace cannot use the host's"
    return None


def _security_context(sc: Any) -> Problem:
    if sc.privileged and _own_userns(sc.namespace_options):
        return "privileged: not allowed with a user namespace (userns_options mode POD)"
    return None


def _mount_maps(m: Any) -> Problem:
    if bool(m.uidMappings) != bool(m.gidMappings):
        return "uidMappings: an idmapped mount needs both uidMappings and gidMappings"
    return _id_maps("uidMappings", m.uidMappings) or _id_maps("gidMappings", m.gidMappings)


# Message -> a check across its fields (after each field passed its own checks).
MESSAGE_RULES: dict[str, Check] = {
    "PortMapping": _port_mapping,
    "Mount": lambda m: _mount(m) or _mount_maps(m),
    "UserNamespace": _userns,
    "NamespaceOption": _namespaces,
    "LinuxSandboxSecurityContext": _security_context,
    "LinuxContainerSecurityContext": _security_context,
    "Device": _device,
    "ContainerConfig": _cdi_annotations,
    "LinuxContainerResources": _resources,
    "LinuxPodSandboxConfig": _pod_linux,
    # A pod resize takes what RunPodSandbox takes.
    "UpdatePodSandboxResourcesRequest": _pod_resources,
}

# Request -> dotted paths that must be set for the RPC to mean anything.
REQUIRED: dict[str, tuple[str, ...]] = {
    "RunPodSandboxRequest": ("config.metadata.name", "config.metadata.namespace",
                             "config.metadata.uid"),
    "CreateContainerRequest": ("pod_sandbox_id", "config.metadata.name"),
    "UpdatePodSandboxResourcesRequest": ("pod_sandbox_id",),
    "ExecSyncRequest": ("container_id", "cmd"),
    "ExecRequest": ("container_id", "cmd"),
    "AttachRequest": ("container_id",),
    "PortForwardRequest": ("pod_sandbox_id",),
    "PullImageRequest": ("image.image",),
    "ImageStatusRequest": ("image.image",),
    "RemoveImageRequest": ("image.image",),
    "CheckpointContainerRequest": ("container_id", "location"),
    "CheckpointPodRequest": ("pod_sandbox_id", "output_path"),
    "RestorePodRequest": ("checkpoint_path",),
}


# Request -> repeated string fields whose first entry names a program to run.
PROGRAMS: dict[str, str] = {"ExecSyncRequest": "cmd", "ExecRequest": "cmd"}


def check_request(request: Message) -> None:
    """Raise InvalidArgument for the first malformed field of a CRI request."""
    _walk(request, "")
    name = request.DESCRIPTOR.name
    for path in REQUIRED.get(name, ()):
        if not _lookup(request, path):
            raise InvalidArgument(f"{path}: must be set")
    argv = getattr(request, PROGRAMS[name]) if name in PROGRAMS else None
    if argv and not argv[0]:
        raise InvalidArgument(f"{PROGRAMS[name]}[0]: must name the program to run")


def _lookup(msg: Any, path: str) -> Any:
    for part in path.split("."):
        msg = getattr(msg, part)
    return msg


def _walk(msg: Message, prefix: str, as_name: str = "") -> None:
    desc = msg.DESCRIPTOR
    name = as_name or desc.name
    for field, value in msg.ListFields():
        where = prefix + field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            _check_map(name, field, value, where)
        elif field.is_repeated:
            most = MAX_ITEMS_OF.get((name, field.name), MAX_ITEMS)
            if len(value) > most:
                raise InvalidArgument(f"{where}: more than {most} entries")
            for i, item in enumerate(value):
                _check_value(name, field.name, field, item, f"{where}[{i}]")
        else:
            _check_value(name, field.name, field, value, where)
    rule = MESSAGE_RULES.get(name)
    if rule is not None and (problem := rule(msg)):
        raise InvalidArgument(f"{prefix}{problem}")


def _check_map(message: str, field: FieldDescriptor, value: Any, where: str) -> None:
    if len(value) > MAX_ITEMS:
        raise InvalidArgument(f"{where}: more than {MAX_ITEMS} entries")
    if field.name in SIZED_MAPS:
        size = sum(len(k.encode()) + len(v.encode()) for k, v in value.items())
        if size > MAX_MAP_BYTES:
            raise InvalidArgument(f"{where}: {size} bytes in total, more than {MAX_MAP_BYTES}")
    entry = field.message_type
    assert entry is not None
    key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
    for k, v in value.items():
        # Keys are shown cut short: a status message must fit in the HTTP/2 trailers.
        shown = k if not isinstance(k, str) or len(k) <= 64 else k[:64] + "…"
        at = f"{where}[{shown!r}]"
        _check_value(message, f"{field.name}.key", key_field, k, f"{at} (key)")
        _check_value(message, f"{field.name}.value", value_field, v, at)


def _check_value(
    message: str, name: str, field: FieldDescriptor, value: Any, where: str
) -> None:
    problem: Problem = None
    if field.message_type is not None:
        rng = RANGES.get((message, name))
        if rng is not None and "value" in field.message_type.fields_by_name:
            problem = rng(value.value)  # a wrapper such as Int64Value
        else:
            _walk(value, where + ".", CHECKED_AS.get((message, name), ""))
    elif field.type == FieldDescriptor.TYPE_STRING:
        problem = _string_problem(value, _kind(message, name))
    elif field.enum_type is not None:
        if value not in field.enum_type.values_by_number:
            problem = f"{value} is not a known {field.enum_type.name}"
    elif field.type != FieldDescriptor.TYPE_BYTES and (rng := RANGES.get((message, name))):
        problem = rng(value)
    if problem:
        raise InvalidArgument(f"{where}: {problem}")


def _string_problem(value: str, kind: Kind) -> Problem:
    if len(value) > kind.max_len:
        return f"longer than {kind.max_len} characters ({len(value)})"
    # isprintable() is the fastest scan in C; only strings it rejects are searched.
    bad = None if value.isprintable() else (
        _NUL if kind.free_text else _CONTROL).search(value)
    if bad:
        o = ord(bad.group())
        return "contains a NUL byte" if o == 0 else f"contains control character {o:#04x}"
    return kind.check(value) if kind.check else None
