"""CRI request + image config → OCI runtime spec (config.json), as pure functions.

Everything the host knows (namespace paths, resolved user, seccomp profile, devices,
the daemon's oom_score_adj) is looked up by the caller and passed in a context, so
each rule here is testable field by field and the same input always gives the same
spec.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.cdi import edits as cdi_edits
from pycri.cdi.schema import ContainerEdits
from pycri.errors import InvalidArgument
from pycri.oci import bindopts, selinux
from pycri.oci import seccomp as seccomp_mod
from pycri.oci.users import ResolvedUser

OCI_VERSION = "1.0.2"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INFRA_MOUNT = "/catatonit"
INFRA_OOM_SCORE_ADJ = -998

# Capability numbers 0..40, in kernel order.
ALL_CAPABILITIES: tuple[str, ...] = tuple(
    "CAP_" + n
    for n in [
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "KILL",
        "SETGID",
        "SETUID",
        "SETPCAP",
        "LINUX_IMMUTABLE",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_ADMIN",
        "NET_RAW",
        "IPC_LOCK",
        "IPC_OWNER",
        "SYS_MODULE",
        "SYS_RAWIO",
        "SYS_CHROOT",
        "SYS_PTRACE",
        "SYS_PACCT",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_NICE",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "MKNOD",
        "LEASE",
        "AUDIT_WRITE",
        "AUDIT_CONTROL",
        "SETFCAP",
        "MAC_OVERRIDE",
        "MAC_ADMIN",
        "SYSLOG",
        "WAKE_ALARM",
        "BLOCK_SUSPEND",
        "AUDIT_READ",
        "PERFMON",
        "BPF",
        "CHECKPOINT_RESTORE",
    ]
)

DEFAULT_CAPABILITIES: tuple[str, ...] = tuple(
    "CAP_" + n
    for n in [
        "CHOWN",
        "DAC_OVERRIDE",
        "FSETID",
        "FOWNER",
        "MKNOD",
        "NET_RAW",
        "SETGID",
        "SETUID",
        "SETFCAP",
        "SETPCAP",
        "NET_BIND_SERVICE",
        "SYS_CHROOT",
        "KILL",
        "AUDIT_WRITE",
    ]
)

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

_PROPAGATION = {
    pb.PROPAGATION_PRIVATE: "rprivate",
    pb.PROPAGATION_HOST_TO_CONTAINER: "rslave",
    pb.PROPAGATION_BIDIRECTIONAL: "rshared",
}

ANNOTATION_PREFIX = "io.kubernetes.cri."
# The pod-level resources a VM-based handler sizes its sandbox by (containerd's names and
# meaning: LinuxPodSandboxConfig.resources, the sum of the containers' limits).
SANDBOX_RESOURCE_ANNOTATIONS = {
    ANNOTATION_PREFIX + "sandbox-cpu-period": "cpu_period",
    ANNOTATION_PREFIX + "sandbox-cpu-quota": "cpu_quota",
    ANNOTATION_PREFIX + "sandbox-cpu-shares": "cpu_shares",
    ANNOTATION_PREFIX + "sandbox-memory": "memory_limit_in_bytes",
}
CFS_PERIOD = 100_000  # µs, the kernel's default (and the kubelet's) CFS period
MAX_CPU_SHARES = 262_144


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config that shape the container process."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""
    stop_signal: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_oci(cls, config_json: Mapping[str, Any]) -> ImageConfig:
        """Accept a whole image config (with "config") or its inner object; reject bad types.

        Images are untrusted input, so a wrong type is InvalidArgument, not a crash.
        """
        inner = config_json.get("config", config_json)
        if inner is None:
            return cls()
        if not isinstance(inner, Mapping):
            raise InvalidArgument("image config: 'config' is not an object")

        def strings(key: str) -> tuple[str, ...]:
            v = inner.get(key)
            if v is None:
                return ()
            if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
                raise InvalidArgument(f"image config: {key!r} must be a list of strings")
            return tuple(v)

        def string(key: str) -> str:
            v = inner.get(key)
            if v is None:
                return ""
            if not isinstance(v, str):
                raise InvalidArgument(f"image config: {key!r} must be a string")
            return v

        labels = inner.get("Labels") or {}
        if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise InvalidArgument("image config: 'Labels' must map strings to strings")
        return cls(
            entrypoint=strings("Entrypoint"),
            cmd=strings("Cmd"),
            env=strings("Env"),
            working_dir=string("WorkingDir"),
            user=string("User"),
            stop_signal=string("StopSignal"),
            labels=dict(labels),
        )


@dataclass(frozen=True)
class DeviceInfo:
    """A device node as the container will see it (host facts read by mounts.py)."""

    path: str  # inside the container
    type: str  # "c", "b" or "p"
    major: int
    minor: int
    file_mode: int = 0o666
    uid: int = 0
    gid: int = 0
    permissions: str = "rwm"


@dataclass(frozen=True)
class Rlimit:
    type: str  # e.g. "RLIMIT_NOFILE"
    soft: int
    hard: int


@dataclass(frozen=True)
class IDMap:
    """One line of a uid_map or gid_map: `length` IDs from `container_id` on, as `host_id` on."""

    container_id: int
    host_id: int
    length: int

    def oci(self) -> dict[str, int]:
        return {"containerID": self.container_id, "hostID": self.host_id, "size": self.length}


def _mapped(maps: Iterable[IDMap], i: int) -> bool:
    return any(m.container_id <= i < m.container_id + m.length for m in maps)


@dataclass(frozen=True)
class UserNamespace:
    """A pod's own user namespace: the pinned namespace to join and its mappings (the
    runtime wants them even when it joins, to know the host IDs of container root)."""

    path: str
    uids: tuple[IDMap, ...]
    gids: tuple[IDMap, ...]

    def check_user(self, user: ResolvedUser) -> None:
        """The process's IDs must exist in the namespace, or the runtime's setuid fails."""
        for kind, ids, maps in (("uid", (user.uid,), self.uids),
                                ("gid", (user.gid, *user.additional_gids), self.gids)):
            for i in ids:
                if not _mapped(maps, i):
                    raise InvalidArgument(
                        f"{kind} {i} is not mapped in the pod's user namespace ("
                        + ", ".join(f"{m.container_id}-{m.container_id + m.length - 1}"
                                    for m in maps) + ")")

    def maps_gid(self, gid: int) -> bool:
        return _mapped(self.gids, gid)

    def linux(self) -> dict[str, Any]:
        return {"uidMappings": [m.oci() for m in self.uids],
                "gidMappings": [m.oci() for m in self.gids]}


def pod_id_maps(config: pb.PodSandboxConfig) -> tuple[tuple[IDMap, ...], tuple[IDMap, ...]] | None:
    """The pod's (uid, gid) mappings when it asks for its own user namespace, else None.

    Unset options, or mode NODE, keep the host's user namespace; the request gate has
    refused every other mode and every mapping pycri cannot honour.
    """
    ns = config.linux.security_context.namespace_options
    if not ns.HasField("userns_options") or ns.userns_options.mode != pb.POD:
        return None
    opts = ns.userns_options
    return (tuple(IDMap(m.container_id, m.host_id, m.length) for m in opts.uids),
            tuple(IDMap(m.container_id, m.host_id, m.length) for m in opts.gids))


@dataclass(frozen=True)
class ContainerContext:
    """What the caller resolved on the host before asking for a container's spec.

    Namespace paths are the sandbox's: they are joined when the container's mode is
    POD. `pid_ns` is the infra's for POD and the target container's for TARGET.
    """

    container_id: str
    sandbox_id: str
    rootfs: str
    user: ResolvedUser
    net_ns: str | None = None
    ipc_ns: str | None = None
    uts_ns: str | None = None
    pid_ns: str | None = None
    hostname: str = ""
    hostname_path: str | None = None
    resolv_conf_path: str | None = None
    hosts_path: str | None = None
    shm_path: str | None = None
    seccomp: Mapping[str, Any] | None = None
    cgroup_parent: str = ""
    cgroup_driver: str = "cgroupfs"
    min_oom_score_adj: int = -1000
    # What the daemon itself may hand out (its bounding set): privileged and "ALL" mean this.
    available_capabilities: Sequence[str] = ALL_CAPABILITIES
    devices: Sequence[DeviceInfo] = ()  # the CRI devices, resolved (mounts.resolve_device)
    host_devices: Sequence[DeviceInfo] = ()  # for privileged containers
    # CRI host_path → resolved path; image_volume_key(i) → the prepared image volume
    mount_sources: Mapping[str, str] = field(default_factory=dict)
    apparmor_enabled: bool = False
    apparmor_default_profile: str = ""
    rlimits: Sequence[Rlimit] = ()
    selinux_enabled: bool = False  # the host has SELinux (selinux.enabled())
    userns: UserNamespace | None = None  # the pod's own user namespace, joined
    # The CDI devices' edits, resolved (cdi/registry.py), applied last in their order.
    cdi_edits: Sequence[ContainerEdits] = ()


@dataclass(frozen=True)
class SandboxContext:
    """What the caller resolved for the pod's infra process.

    Without `image`, the rootfs is an empty directory and `infra_binary` (static
    catatonit) is bind-mounted into it; with `image`, its rootfs and entrypoint are used.
    """

    sandbox_id: str
    rootfs: str
    user: ResolvedUser = field(default_factory=lambda: ResolvedUser(0, 0, (0,)))
    infra_binary: str = "/usr/bin/catatonit"
    image: ImageConfig | None = None
    net_ns: str | None = None  # pinned /run/netns/...; None: a new one (unless host network)
    shm_path: str | None = None
    seccomp: Mapping[str, Any] | None = None
    cgroup_parent: str = ""
    cgroup_driver: str = "cgroupfs"
    min_oom_score_adj: int = -1000
    oom_score_adj: int = INFRA_OOM_SCORE_ADJ
    available_capabilities: Sequence[str] = ALL_CAPABILITIES
    apparmor_enabled: bool = False
    apparmor_default_profile: str = ""
    selinux_enabled: bool = False  # the host has SELinux (selinux.enabled())
    userns: UserNamespace | None = None  # the pod's own user namespace (pinned), joined


# ---------------------------------------------------------------- small rules


def process_args(command: Sequence[str], args: Sequence[str], image: ImageConfig) -> list[str]:
    """Docker semantics: command replaces ENTRYPOINT and drops CMD; args replace CMD."""
    if command:
        out = list(command) + list(args)
    else:
        out = list(image.entrypoint) + (list(args) if args else list(image.cmd))
    if not out:
        raise InvalidArgument("no command specified: neither the request nor the image has one")
    return out


def _decode(value: str | bytes) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def process_env(
    image_env: Iterable[str], cri_env: Iterable[pb.KeyValue], hostname: str = ""
) -> list[str]:
    """Default PATH, HOSTNAME, image env, CRI env: later wins, first position kept."""
    env: dict[str, str] = {}

    def put(entry: str) -> None:
        key, _, value = entry.partition("=")
        if key:
            env[key] = value

    put(DEFAULT_PATH)
    if hostname:
        put(f"HOSTNAME={hostname}")
    for entry in image_env:
        put(entry)
    for kv in cri_env:
        if not kv.key or "=" in kv.key:
            raise InvalidArgument(f"invalid environment variable name {kv.key!r}")
        value = _decode(kv.value)
        if "\0" in kv.key or "\0" in value:
            raise InvalidArgument(f"environment variable {kv.key!r} contains a NUL byte")
        env[kv.key] = value
    return [f"{k}={v}" for k, v in env.items()]


def working_dir(requested: str, image: ImageConfig) -> str:
    cwd = requested or image.working_dir or "/"
    if not cwd.startswith("/"):
        raise InvalidArgument(f"working directory {cwd!r} must be absolute")
    return posixpath.normpath(cwd).replace("//", "/")


def _cap_name(name: str) -> str:
    n = name.strip().upper()
    if n == "ALL":
        return n
    if not n.startswith("CAP_"):
        n = "CAP_" + n
    if n not in ALL_CAPABILITIES:
        raise InvalidArgument(f"unknown capability {name!r}")
    return n


def capabilities_from_mask(mask: int) -> tuple[str, ...]:
    """Names of the bits set in a /proc/<pid>/status Cap* mask (bits we know)."""
    return tuple(c for i, c in enumerate(ALL_CAPABILITIES) if mask >> i & 1)


def capabilities(
    cap: pb.Capability, privileged: bool, available: Iterable[str] = ALL_CAPABILITIES
) -> dict[str, list[str]]:
    """The OCI capability sets. Drops apply before adds, so `drop ALL, add X` keeps X;
    ambient capabilities are also put in every other set (the kernel requires it).

    Everything is limited to `available` (the daemon's own bounding set): runc and crun
    fail to start a process asking for a capability its parent lacks.
    """
    add = [_cap_name(c) for c in cap.add_capabilities]
    drop = [_cap_name(c) for c in cap.drop_capabilities]
    ambient = [_cap_name(c) for c in cap.add_ambient_capabilities]
    if "ALL" in ambient:
        raise InvalidArgument("ALL is not allowed in add_ambient_capabilities")
    if privileged:
        base = set(ALL_CAPABILITIES)
    else:
        base = set(ALL_CAPABILITIES if "ALL" in add else DEFAULT_CAPABILITIES)
        if "ALL" in drop:
            base = set()
        base -= set(drop)
        base |= {c for c in add if c != "ALL"}
    base |= set(ambient)
    have = set(available)

    def ordered(s: set[str]) -> list[str]:
        return [c for c in ALL_CAPABILITIES if c in s and c in have]

    return {
        "bounding": ordered(base),
        "effective": ordered(base),
        "permitted": ordered(base),
        "inheritable": ordered(set(ambient)),
        "ambient": ordered(set(ambient)),
    }


def clamp_oom_score_adj(requested: int, minimum: int) -> int:
    """Never below the daemon's own value (no CAP_SYS_RESOURCE), within the kernel range."""
    return min(1000, max(requested, minimum, -1000))


def cgroups_path(parent: str, driver: str, object_id: str) -> str:
    """cgroupfs: `<parent>/pycri-<id>` (parent defaults to /pycri);
    systemd: `<slice>:pycri:<id>` (slice defaults to system.slice)."""
    if driver == "cgroupfs":
        parent = "/" + (parent or "/pycri").strip("/")
        if ".." in parent.split("/"):
            raise InvalidArgument(f"cgroup parent {parent!r} must not contain '..'")
        return posixpath.join(parent, f"pycri-{object_id}")
    if driver == "systemd":
        slice_ = parent or "system.slice"
        if "/" in slice_ or not slice_.endswith(".slice"):
            raise InvalidArgument(
                f"cgroup parent {parent!r} is not a systemd slice (name ending in .slice)"
            )
        return f"{slice_}:pycri:{object_id}"
    raise InvalidArgument(f"unknown cgroup driver {driver!r}")


def pod_limits(linux: pb.LinuxPodSandboxConfig) -> dict[str, Any]:
    """OCI-style cpu/memory limits of a pod cgroup pycri creates itself: the pod-level
    `resources` plus the handler's `overhead`, as the kubelet sizes the pod cgroups it
    owns, and the pod's cgroup v2 `unified` files. A limit the pod does not set stays
    unset: overhead alone bounds nothing.
    """
    res, ovh = linux.resources, linux.overhead
    cpu: dict[str, Any] = {}
    if res.cpu_shares > 0:
        cpu["shares"] = min(MAX_CPU_SHARES, res.cpu_shares + max(0, ovh.cpu_shares))
    if res.cpu_quota > 0:
        period = res.cpu_period or CFS_PERIOD
        extra = ovh.cpu_quota * period // (ovh.cpu_period or CFS_PERIOD) if ovh.cpu_quota > 0 else 0
        cpu["quota"], cpu["period"] = res.cpu_quota + extra, period
    out: dict[str, Any] = {"cpu": cpu} if cpu else {}
    if res.memory_limit_in_bytes > 0:
        out["memory"] = {"limit": res.memory_limit_in_bytes + max(0, ovh.memory_limit_in_bytes)}
    if res.unified:
        out["unified"] = dict(res.unified)
    return out


def resources_to_oci(res: pb.LinuxContainerResources) -> dict[str, Any]:
    """OCI linux.resources for CreateContainer and UpdateContainerResources; 0 = unset."""
    out: dict[str, Any] = {}
    cpu: dict[str, Any] = {}
    if res.cpu_shares:
        cpu["shares"] = res.cpu_shares
    if res.cpu_quota:
        cpu["quota"] = res.cpu_quota
    if res.cpu_period:
        cpu["period"] = res.cpu_period
    if res.cpuset_cpus:
        cpu["cpus"] = res.cpuset_cpus
    if res.cpuset_mems:
        cpu["mems"] = res.cpuset_mems
    if cpu:
        out["cpu"] = cpu
    memory: dict[str, Any] = {}
    if res.memory_limit_in_bytes:
        memory["limit"] = res.memory_limit_in_bytes
    if res.memory_swap_limit_in_bytes:
        memory["swap"] = res.memory_swap_limit_in_bytes
    if memory:
        out["memory"] = memory
    if res.hugepage_limits:
        out["hugepageLimits"] = [
            {"pageSize": h.page_size, "limit": h.limit} for h in res.hugepage_limits
        ]
    if res.unified:
        out["unified"] = dict(res.unified)
    return out


def _clean_dest(path: str) -> str:
    if not path.startswith("/"):
        raise InvalidArgument(f"container path {path!r} must be absolute")
    return posixpath.normpath(path).replace("//", "/")


def image_volume_key(index: int) -> str:
    """The `mount_sources` key of the image volume at `index` in the CRI mounts; host
    paths are absolute, so it cannot collide with one."""
    return f"image-volume:{index}"


def rro_key(index: int) -> str:
    """The `mount_sources` key of the staged, recursively read-only copy of mount `index`."""
    return f"recursive-read-only:{index}"


def idmap_key(index: int) -> str:
    """The `mount_sources` key of the staged, idmapped copy of mount `index` (also
    recursively read-only when the mount asks for both)."""
    return f"idmapped:{index}"


def is_idmapped(m: pb.Mount) -> bool:
    return bool(m.uidMappings or m.gidMappings)


def check_recursive_read_only(m: pb.Mount) -> None:
    """A recursively read-only mount must be read-only and private (the CRI contract)."""
    if not m.readonly:
        raise InvalidArgument(f"mount {m.container_path}: recursive_read_only needs readonly")
    if m.propagation != pb.PROPAGATION_PRIVATE:
        raise InvalidArgument(
            f"mount {m.container_path}: recursive_read_only needs private propagation"
        )


def cri_mounts(
    mounts: Iterable[pb.Mount], sources: Mapping[str, str]
) -> tuple[list[dict[str, Any]], str | None]:
    """CRI bind mounts and the rootfs propagation they need (None: leave the default).

    An image volume (`image` set) binds its prepared view, read-only and private: an
    image never changes, so propagation means nothing for it. A recursively read-only
    mount binds the copy the caller staged read-only on the host (`rro_key`): a bind of
    it keeps every submount read-only, which runc 1.1 and crun 1.8 cannot do themselves.
    `mount_options` merge into each bind's options (oci/bindopts.py); the runtimes apply
    them by remounting the bind.
    A mount with uid/gid mappings binds the idmapped copy the caller staged (`idmap_key`):
    runc 1.1 ignores the `idmap` option, so the runtime is only ever given a bind.
    """
    out: list[dict[str, Any]] = []
    rootfs_propagation: str | None = None
    for i, m in enumerate(mounts):
        dest = _clean_dest(m.container_path)
        if dest == "/":
            raise InvalidArgument("a mount cannot target the container's /")
        if m.image.image:
            check_image_volume(m)
            source = sources.get(image_volume_key(i))
            if source is None:
                raise InvalidArgument(f"mount {dest}: image volume was not prepared")
            # One overlay mount, no submounts: read-only is already recursive.
            out.append({"destination": dest, "type": "bind", "source": source,
                        "options": bindopts.merge(["rbind", "rprivate", "ro"],
                                                  m.mount_options)})
            continue
        if not m.host_path:
            raise InvalidArgument(f"mount {dest}: host path is empty")
        prop = _PROPAGATION.get(m.propagation)
        if prop is None:
            raise InvalidArgument(f"mount {dest}: unknown propagation {m.propagation}")
        opts = bindopts.merge(["rbind", prop, "ro" if m.readonly else "rw"], m.mount_options)
        source = sources.get(m.host_path, m.host_path)
        if m.recursive_read_only:
            check_recursive_read_only(m)
        staged_key = (idmap_key(i) if is_idmapped(m)
                      else rro_key(i) if m.recursive_read_only else None)
        if staged_key is not None:
            staged = sources.get(staged_key)
            if staged is None:
                raise InvalidArgument(f"mount {dest}: its copy ({staged_key}) was not staged")
            source = staged
        if prop == "rshared":
            rootfs_propagation = "rshared"
        elif prop == "rslave" and rootfs_propagation is None:
            rootfs_propagation = "rslave"
        out.append(
            {
                "destination": dest,
                "type": "bind",
                "source": source,
                "options": opts,
            }
        )
    return out, rootfs_propagation


def check_image_volume(m: pb.Mount) -> None:
    """The CRI rules of an image volume: read-only by definition, no host path."""
    if m.host_path:
        raise InvalidArgument(
            f"mount {m.container_path}: host_path and image are mutually exclusive"
        )
    if not m.readonly:
        raise InvalidArgument(
            f"mount {m.container_path}: image volumes are read-only; set readonly"
        )


TTY_GID = 5  # devpts gives new ptys this group, which must exist in a user namespace


def _base_mounts(
    privileged: bool, shm_path: str | None, userns: UserNamespace | None = None
) -> list[dict[str, Any]]:
    sys_mode = "rw" if privileged else "ro"
    devpts = ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]
    if userns is None or userns.maps_gid(TTY_GID):  # else the kernel refuses the mount
        devpts.append(f"gid={TTY_GID}")
    shm: dict[str, Any]
    if shm_path:
        shm = {
            "destination": "/dev/shm",
            "type": "bind",
            "source": shm_path,
            "options": ["rbind", "rprivate", "nosuid", "nodev", "noexec", "rw"],
        }
    else:
        shm = {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        }
    return [
        {
            "destination": "/proc",
            "type": "proc",
            "source": "proc",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": devpts,
        },
        shm,
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", sys_mode],
        },
        {
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", sys_mode],
        },
    ]


def _pod_file_mounts(ctx: ContainerContext, readonly: bool) -> list[dict[str, Any]]:
    mode = "ro" if readonly else "rw"
    out = []
    for dest, src in (
        ("/etc/hostname", ctx.hostname_path),
        ("/etc/hosts", ctx.hosts_path),
        ("/etc/resolv.conf", ctx.resolv_conf_path),
    ):
        if src:
            out.append(
                {
                    "destination": dest,
                    "type": "bind",
                    "source": src,
                    "options": ["rbind", "rprivate", mode],
                }
            )
    return out


def _merge_mounts(
    defaults: list[dict[str, Any]], user: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A user mount replaces the default at the same path; parents mount before children."""
    taken = {m["destination"] for m in user}
    merged = [m for m in defaults if m["destination"] not in taken] + user
    return sorted(merged, key=cdi_edits.mount_depth)


def _device_entries(
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


def _join(kind: str, path: str | None, what: str) -> dict[str, str]:
    if not path:
        raise InvalidArgument(f"the sandbox has no {what} namespace to join")
    return {"type": kind, "path": path}


def container_namespaces(opts: pb.NamespaceOption, ctx: ContainerContext) -> list[dict[str, str]]:
    """Mount ns always new; net/uts/ipc of the pod (or host); pid per its mode; the pod's
    user namespace when it has one."""
    ns: list[dict[str, str]] = [{"type": "mount"}]
    if ctx.userns is not None:
        ns.append({"type": "user", "path": ctx.userns.path})
    if opts.network != pb.NODE:
        ns.append(_join("network", ctx.net_ns, "network"))
        ns.append(_join("uts", ctx.uts_ns, "UTS"))
    if opts.ipc == pb.CONTAINER:
        ns.append({"type": "ipc"})
    elif opts.ipc != pb.NODE:
        ns.append(_join("ipc", ctx.ipc_ns, "IPC"))
    if opts.pid == pb.CONTAINER:
        ns.append({"type": "pid"})
    elif opts.pid == pb.TARGET:
        if not ctx.pid_ns:
            raise InvalidArgument(f"no PID namespace of target container {opts.target_id!r}")
        ns.append({"type": "pid", "path": ctx.pid_ns})
    elif opts.pid == pb.POD:
        ns.append(_join("pid", ctx.pid_ns, "PID"))
    return ns


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


def _security_profile(msg: Any, field_name: str) -> pb.SecurityProfile | None:
    return getattr(msg, field_name) if msg.HasField(field_name) else None


def _user(u: ResolvedUser) -> dict[str, Any]:
    out: dict[str, Any] = {"uid": u.uid, "gid": u.gid}
    if u.additional_gids:
        out["additionalGids"] = list(u.additional_gids)
    return out


def _selinux_labels(
    process: dict[str, Any], linux: dict[str, Any], options: pb.SELinuxOption
) -> None:
    """process.selinuxLabel and linux.mountLabel from the request's SELinux options."""
    process["selinuxLabel"] = selinux.process_label(options)
    linux["mountLabel"] = selinux.mount_label(options)


def _relabel(entries: list[dict[str, Any]], mounts: Sequence[pb.Mount]) -> None:
    """`z` (shared relabel) on the binds whose CRI mount asks for it; an image volume is
    a read-only view that cannot be relabelled. `entries` are cri_mounts' output, one per
    CRI mount in the same order."""
    for entry, m in zip(entries, mounts, strict=True):
        if m.selinux_relabel and not m.image.image:
            entry["options"].append("z")


# ---------------------------------------------------------------- the specs


def container_spec(
    config: pb.ContainerConfig,
    sandbox: pb.PodSandboxConfig,
    image: ImageConfig,
    ctx: ContainerContext,
) -> dict[str, Any]:
    """The OCI runtime spec of one container of a pod."""
    sc = config.linux.security_context
    privileged = sc.privileged
    if privileged and not sandbox.linux.security_context.privileged:
        raise InvalidArgument("a privileged container needs a privileged sandbox")
    caps = capabilities(sc.capabilities, privileged, ctx.available_capabilities)
    host_uts = sc.namespace_options.network == pb.NODE
    if ctx.userns is not None:
        ctx.userns.check_user(ctx.user)

    process: dict[str, Any] = {
        "terminal": config.tty,
        "user": _user(ctx.user),
        "args": process_args(config.command, config.args, image),
        "env": process_env(image.env, config.envs, ctx.hostname),
        "cwd": working_dir(config.working_dir, image),
        "capabilities": caps,
        "noNewPrivileges": sc.no_new_privs,
        "oomScoreAdj": clamp_oom_score_adj(
            config.linux.resources.oom_score_adj, ctx.min_oom_score_adj
        ),
    }
    if ctx.rlimits:
        process["rlimits"] = [{"type": r.type, "soft": r.soft, "hard": r.hard} for r in ctx.rlimits]
    aa = apparmor_profile(
        _security_profile(sc, "apparmor"),
        sc.apparmor_profile,
        privileged,
        ctx.apparmor_enabled,
        ctx.apparmor_default_profile,
    )
    if aa:
        process["apparmorProfile"] = aa

    user_mounts, rootfs_propagation = cri_mounts(config.mounts, ctx.mount_sources)
    if ctx.selinux_enabled:
        _relabel(user_mounts, config.mounts)
    defaults = (_base_mounts(privileged, ctx.shm_path, ctx.userns)
                + _pod_file_mounts(ctx, sc.readonly_rootfs))

    devices = list(ctx.devices)
    dev_rules: list[dict[str, Any]] = [{"allow": False, "access": "rwm"}]
    if privileged:
        devices = list(ctx.host_devices) + devices
        dev_rules = [{"allow": True, "access": "rwm"}]
    dev_nodes, allow_rules = _device_entries(devices)
    resources = resources_to_oci(config.linux.resources)
    resources["devices"] = dev_rules + ([] if privileged else allow_rules)

    linux: dict[str, Any] = {
        "namespaces": container_namespaces(sc.namespace_options, ctx),
        "cgroupsPath": cgroups_path(ctx.cgroup_parent, ctx.cgroup_driver, ctx.container_id),
        "resources": resources,
        "sysctl": dict(sandbox.linux.sysctls),
        "devices": dev_nodes,
    }
    if rootfs_propagation:
        linux["rootfsPropagation"] = rootfs_propagation
    if ctx.selinux_enabled:  # the container's own options, else the pod's
        pod_sc = sandbox.linux.security_context
        if sc.HasField("selinux_options"):
            _selinux_labels(process, linux, sc.selinux_options)
        elif pod_sc.HasField("selinux_options"):
            _selinux_labels(process, linux, pod_sc.selinux_options)
    if ctx.userns is not None:
        linux |= ctx.userns.linux()
    if not privileged:
        linux["maskedPaths"] = list(sc.masked_paths or DEFAULT_MASKED_PATHS)
        linux["readonlyPaths"] = list(sc.readonly_paths or DEFAULT_READONLY_PATHS)
        if ctx.seccomp is not None:
            linux["seccomp"] = seccomp_mod.for_capabilities(dict(ctx.seccomp), caps["bounding"])

    annotations = dict(config.annotations)
    annotations.update(
        {
            ANNOTATION_PREFIX + "container-type": "container",
            ANNOTATION_PREFIX + "container-name": config.metadata.name,
            ANNOTATION_PREFIX + "sandbox-id": ctx.sandbox_id,
            ANNOTATION_PREFIX + "sandbox-name": sandbox.metadata.name,
            ANNOTATION_PREFIX + "sandbox-namespace": sandbox.metadata.namespace,
            ANNOTATION_PREFIX + "sandbox-uid": sandbox.metadata.uid,
            ANNOTATION_PREFIX + "image-name": config.image.user_specified_image
            or config.image.image,
        }
    )

    spec: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": process,
        "root": {"path": ctx.rootfs, "readonly": sc.readonly_rootfs},
        "mounts": _merge_mounts(defaults, user_mounts),
        "annotations": annotations,
        "linux": linux,
    }
    if not host_uts and sandbox.hostname:
        spec["hostname"] = sandbox.hostname
    return cdi_edits.apply(spec, ctx.cdi_edits) if ctx.cdi_edits else spec


def sandbox_spec(config: pb.PodSandboxConfig, ctx: SandboxContext) -> dict[str, Any]:
    """The OCI runtime spec of the pod's infra process, which holds the pod's namespaces."""
    sc = config.linux.security_context
    opts = sc.namespace_options
    privileged = sc.privileged
    caps = capabilities(pb.Capability(), privileged, ctx.available_capabilities)
    mounts = _base_mounts(privileged, ctx.shm_path, ctx.userns)
    if ctx.image is None:
        if not ctx.infra_binary.startswith("/"):
            raise InvalidArgument(f"infra binary {ctx.infra_binary!r} must be an absolute path")
        args = [INFRA_MOUNT, "-P"]
        env = [DEFAULT_PATH]
        cwd = "/"
        mounts.append(
            {
                "destination": INFRA_MOUNT,
                "type": "bind",
                "source": ctx.infra_binary,
                "options": ["rbind", "rprivate", "ro", "nosuid", "nodev"],
            }
        )
    else:
        args = process_args((), (), ctx.image)
        env = process_env(ctx.image.env, ())
        cwd = working_dir("", ctx.image)

    process: dict[str, Any] = {
        "terminal": False,
        "user": _user(ctx.user),
        "args": args,
        "env": env,
        "cwd": cwd,
        "capabilities": caps,
        "noNewPrivileges": True,
        "oomScoreAdj": clamp_oom_score_adj(ctx.oom_score_adj, ctx.min_oom_score_adj),
    }
    aa = apparmor_profile(
        _security_profile(sc, "apparmor"),
        "",
        privileged,
        ctx.apparmor_enabled,
        ctx.apparmor_default_profile,
    )
    if aa:
        process["apparmorProfile"] = aa

    ns: list[dict[str, str]] = [{"type": "mount"}]
    if ctx.userns is not None:
        ns.append({"type": "user", "path": ctx.userns.path})
    if opts.network != pb.NODE:
        ns.append({"type": "network", "path": ctx.net_ns} if ctx.net_ns else {"type": "network"})
        ns.append({"type": "uts"})
    if opts.ipc != pb.NODE:
        ns.append({"type": "ipc"})
    if opts.pid != pb.NODE:
        ns.append({"type": "pid"})

    linux: dict[str, Any] = {
        "namespaces": ns,
        "cgroupsPath": cgroups_path(ctx.cgroup_parent, ctx.cgroup_driver, ctx.sandbox_id),
        "resources": {"devices": [{"allow": privileged, "access": "rwm"}]},
        "sysctl": dict(config.linux.sysctls),
    }
    if ctx.selinux_enabled and sc.HasField("selinux_options"):
        _selinux_labels(process, linux, sc.selinux_options)
    if ctx.userns is not None:
        ctx.userns.check_user(ctx.user)
        linux |= ctx.userns.linux()
    if not privileged:
        linux["maskedPaths"] = list(DEFAULT_MASKED_PATHS)
        linux["readonlyPaths"] = list(DEFAULT_READONLY_PATHS)
        if ctx.seccomp is not None:
            linux["seccomp"] = seccomp_mod.for_capabilities(dict(ctx.seccomp), caps["bounding"])

    annotations = dict(config.annotations)
    annotations.update(
        {
            ANNOTATION_PREFIX + "container-type": "sandbox",
            ANNOTATION_PREFIX + "sandbox-id": ctx.sandbox_id,
            ANNOTATION_PREFIX + "sandbox-name": config.metadata.name,
            ANNOTATION_PREFIX + "sandbox-namespace": config.metadata.namespace,
            ANNOTATION_PREFIX + "sandbox-uid": config.metadata.uid,
            ANNOTATION_PREFIX + "sandbox-log-directory": config.log_directory,
        }
    )
    if config.linux.HasField("resources"):
        res = config.linux.resources
        for key, name in SANDBOX_RESOURCE_ANNOTATIONS.items():
            annotations[key] = str(getattr(res, name))
    spec: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": process,
        "root": {"path": ctx.rootfs, "readonly": sc.readonly_rootfs},
        "mounts": mounts,
        "annotations": annotations,
        "linux": linux,
    }
    if opts.network != pb.NODE and config.hostname:
        spec["hostname"] = config.hostname
    return spec
