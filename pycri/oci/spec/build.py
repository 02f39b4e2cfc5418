"""CRI request + image config → OCI runtime spec (config.json): the two entry points,
`container_spec` and `sandbox_spec` (the pod's infra), assembled from the rules of the
sibling modules.

Everything the host knows (namespace paths, resolved user, seccomp profile, devices,
the daemon's oom_score_adj) is looked up by the caller and passed in a context, so
each rule is testable field by field and the same input always gives the same spec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.cdi import edits as cdi_edits
from pycri.cdi.schema import ContainerEdits
from pycri.devices import DeviceInfo
from pycri.errors import InvalidArgument
from pycri.oci.spec.annotations import container_annotations, sandbox_annotations
from pycri.oci.spec.capabilities import ALL_CAPABILITIES, capabilities
from pycri.oci.spec.devices import container_devices
from pycri.oci.spec.image import ImageConfig
from pycri.oci.spec.mounts import (
    base_mounts,
    cri_mounts,
    merge_mounts,
    pod_file_mounts,
    relabel,
)
from pycri.oci.spec.namespaces import UserNamespace, container_namespaces, sandbox_namespaces
from pycri.oci.spec.process import (
    DEFAULT_PATH,
    Rlimit,
    clamp_oom_score_adj,
    oci_rlimits,
    oci_user,
    process_args,
    process_env,
    working_dir,
)
from pycri.oci.spec.resources import cgroups_path, resources_to_oci
from pycri.oci.spec.security import apparmor_profile, confinement, selinux_labels
from pycri.oci.users import ResolvedUser

OCI_VERSION = "1.0.2"
INFRA_MOUNT = "/catatonit"
INFRA_OOM_SCORE_ADJ = -998


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
    devices: Sequence[DeviceInfo] = ()  # the CRI devices, resolved (devices.resolve_device)
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
        "user": oci_user(ctx.user),
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
        process["rlimits"] = oci_rlimits(ctx.rlimits)
    aa = apparmor_profile(
        sc.apparmor if sc.HasField("apparmor") else None,
        sc.apparmor_profile,
        privileged,
        ctx.apparmor_enabled,
        ctx.apparmor_default_profile,
    )
    if aa:
        process["apparmorProfile"] = aa

    user_mounts, rootfs_propagation = cri_mounts(config.mounts, ctx.mount_sources)
    if ctx.selinux_enabled:
        relabel(user_mounts, config.mounts)
    defaults = base_mounts(privileged, ctx.shm_path, ctx.userns) + pod_file_mounts(
        ctx.hostname_path, ctx.hosts_path, ctx.resolv_conf_path, sc.readonly_rootfs
    )

    dev_nodes, dev_rules = container_devices(ctx.devices, ctx.host_devices, privileged)
    resources = resources_to_oci(config.linux.resources)
    resources["devices"] = dev_rules

    linux: dict[str, Any] = {
        "namespaces": container_namespaces(
            sc.namespace_options, ctx.userns, ctx.net_ns, ctx.uts_ns, ctx.ipc_ns, ctx.pid_ns
        ),
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
            selinux_labels(process, linux, sc.selinux_options)
        elif pod_sc.HasField("selinux_options"):
            selinux_labels(process, linux, pod_sc.selinux_options)
    if ctx.userns is not None:
        linux |= ctx.userns.linux()
    if not privileged:
        linux |= confinement(sc.masked_paths, sc.readonly_paths, ctx.seccomp, caps["bounding"])

    spec: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": process,
        "root": {"path": ctx.rootfs, "readonly": sc.readonly_rootfs},
        "mounts": merge_mounts(defaults, user_mounts),
        "annotations": container_annotations(config, sandbox, ctx.sandbox_id),
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
    mounts = base_mounts(privileged, ctx.shm_path, ctx.userns)
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
        "user": oci_user(ctx.user),
        "args": args,
        "env": env,
        "cwd": cwd,
        "capabilities": caps,
        "noNewPrivileges": True,
        "oomScoreAdj": clamp_oom_score_adj(ctx.oom_score_adj, ctx.min_oom_score_adj),
    }
    aa = apparmor_profile(
        sc.apparmor if sc.HasField("apparmor") else None,
        "",
        privileged,
        ctx.apparmor_enabled,
        ctx.apparmor_default_profile,
    )
    if aa:
        process["apparmorProfile"] = aa

    linux: dict[str, Any] = {
        "namespaces": sandbox_namespaces(opts, ctx.userns, ctx.net_ns),
        "cgroupsPath": cgroups_path(ctx.cgroup_parent, ctx.cgroup_driver, ctx.sandbox_id),
        "resources": {"devices": [{"allow": privileged, "access": "rwm"}]},
        "sysctl": dict(config.linux.sysctls),
    }
    if ctx.selinux_enabled and sc.HasField("selinux_options"):
        selinux_labels(process, linux, sc.selinux_options)
    if ctx.userns is not None:
        ctx.userns.check_user(ctx.user)
        linux |= ctx.userns.linux()
    if not privileged:
        linux |= confinement((), (), ctx.seccomp, caps["bounding"])

    spec: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": process,
        "root": {"path": ctx.rootfs, "readonly": sc.readonly_rootfs},
        "mounts": mounts,
        "annotations": sandbox_annotations(config, ctx.sandbox_id),
        "linux": linux,
    }
    if opts.network != pb.NODE and config.hostname:
        spec["hostname"] = config.hostname
    return spec
