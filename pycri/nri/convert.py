"""pycri's records as NRI messages: what a plugin is told about a pod or a container.

Pure functions. A pod is described from its record alone; a container from its record
(identity, state, timestamps, exit) and the OCI spec it was (or is being) created with,
since that is what the process really gets: the image's entrypoint and env merged in,
every mount, the cgroup path and resources pycri computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.nri.api import api_pb2 as api
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox

# CRI states as NRI sees them; a container whose CreateContainer is in flight is CREATED
# to a plugin (it is being given what it will be created with).
_STATES: dict[int, api.ContainerState] = {
    pb.CONTAINER_UNKNOWN: api.CONTAINER_CREATED,
    pb.CONTAINER_CREATED: api.CONTAINER_CREATED,
    pb.CONTAINER_RUNNING: api.CONTAINER_RUNNING,
    pb.CONTAINER_EXITED: api.CONTAINER_STOPPED,
}
_SECCOMP = {
    pb.SecurityProfile.RuntimeDefault: api.SecurityProfile.RUNTIME_DEFAULT,
    pb.SecurityProfile.Unconfined: api.SecurityProfile.UNCONFINED,
    pb.SecurityProfile.Localhost: api.SecurityProfile.LOCALHOST,
}
_HOOKS = (
    ("prestart", "prestart"),
    ("createRuntime", "create_runtime"),
    ("createContainer", "create_container"),
    ("startContainer", "start_container"),
    ("poststart", "poststart"),
    ("poststop", "poststop"),
)


def pod_sandbox(sb: Sandbox) -> api.PodSandbox:
    config = sb.config
    md = config.metadata
    linux = api.LinuxPodSandbox(cgroup_parent=sb.cgroup_parent)
    if config.linux.HasField("overhead"):
        linux.pod_overhead.CopyFrom(cri_resources(config.linux.overhead))
    if config.linux.HasField("resources"):
        linux.pod_resources.CopyFrom(cri_resources(config.linux.resources))
    if sb.netns:
        linux.namespaces.add(type="network", path=sb.netns)
    return api.PodSandbox(
        id=sb.id,
        name=md.name,
        uid=md.uid,
        namespace=md.namespace,
        labels=dict(config.labels),
        annotations=dict(config.annotations),
        runtime_handler=sb.handler,
        linux=linux,
        pid=sb.infra_pid,
        ips=sb.ips,
    )


def cri_resources(r: pb.LinuxContainerResources) -> api.LinuxResources:
    """CRI resources (a pod's overhead or sum, an UpdateContainerResources request)."""
    out = api.LinuxResources()
    if r.memory_limit_in_bytes:
        out.memory.limit.value = r.memory_limit_in_bytes
    if r.memory_swap_limit_in_bytes:
        out.memory.swap.value = r.memory_swap_limit_in_bytes
    if r.cpu_shares:
        out.cpu.shares.value = r.cpu_shares
    if r.cpu_quota:
        out.cpu.quota.value = r.cpu_quota
    if r.cpu_period:
        out.cpu.period.value = r.cpu_period
    if r.cpuset_cpus:
        out.cpu.cpus = r.cpuset_cpus
    if r.cpuset_mems:
        out.cpu.mems = r.cpuset_mems
    for h in r.hugepage_limits:
        out.hugepage_limits.add(page_size=h.page_size, limit=h.limit)
    out.unified.update(r.unified)
    return out


_SPEC_KEYS = ("process", "mounts", "hooks", "annotations")
_LINUX_KEYS = ("namespaces", "devices", "resources", "cgroupsPath", "sysctl")


def spec_view(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an OCI spec `container` reads: what is kept per container for a
    later Synchronize, without the rest (a seccomp policy alone is tens of KiB)."""
    out = {k: spec[k] for k in _SPEC_KEYS if k in spec}
    linux = spec.get("linux", {})
    out["linux"] = {k: linux[k] for k in _LINUX_KEYS if k in linux}
    return out


def container(c: Container, spec: Mapping[str, Any]) -> api.Container:
    config = c.config
    process = spec.get("process", {})
    out = api.Container(
        id=c.id,
        pod_sandbox_id=c.sandbox_id,
        name=config.metadata.name,
        labels=dict(config.labels),
        annotations=dict(spec.get("annotations") or config.annotations),
        args=process.get("args", []),
        env=process.get("env", []),
        mounts=[
            api.Mount(destination=m.get("destination", ""), type=m.get("type", ""),
                      source=m.get("source", ""), options=m.get("options", []))
            for m in spec.get("mounts", [])
        ],
        hooks=_hooks(spec.get("hooks", {})),
        linux=_linux(spec, config),
        rlimits=[api.POSIXRlimit(type=r["type"], hard=r["hard"], soft=r["soft"])
                 for r in process.get("rlimits", [])],
        CDI_devices=[api.CDIDevice(name=d.name) for d in config.CDI_devices],
        image=api.Image(
            name=config.image.image,
            digest=c.image_ref.partition("@")[2],
            config_digest=c.image_id,
        ),
    )
    user = process.get("user", {})
    out.user.uid = user.get("uid", 0)
    out.user.gid = user.get("gid", 0)
    out.user.additional_gids.extend(user.get("additionalGids", []))
    refresh(out, c)
    return out


def refresh(msg: api.Container, c: Container) -> None:
    """The parts of a container's message that change over its life."""
    msg.state = _STATES.get(c.state, api.CONTAINER_UNKNOWN)
    msg.pid = c.pid
    msg.created_at = c.created_at
    msg.started_at = c.started_at
    msg.finished_at = c.finished_at
    msg.exit_code = c.exit_code
    msg.status_reason = c.reason
    msg.status_message = c.message


def _hooks(hooks: Mapping[str, Any]) -> api.Hooks:
    out = api.Hooks()
    for oci, field in _HOOKS:
        for h in hooks.get(oci, []):
            hook = getattr(out, field).add(path=h.get("path", ""), args=h.get("args", []),
                                           env=h.get("env", []))
            if "timeout" in h:
                hook.timeout.value = h["timeout"]
    return out


def _linux(spec: Mapping[str, Any], config: pb.ContainerConfig) -> api.LinuxContainer:
    linux = spec.get("linux", {})
    process = spec.get("process", {})
    out = api.LinuxContainer(
        namespaces=[api.LinuxNamespace(type=n["type"], path=n.get("path", ""))
                    for n in linux.get("namespaces", [])],
        resources=oci_resources(linux.get("resources", {})),
        cgroups_path=linux.get("cgroupsPath", ""),
        sysctl=linux.get("sysctl", {}),
    )
    for d in linux.get("devices", []):
        dev = out.devices.add(path=d["path"], type=d.get("type", ""),
                              major=d.get("major", 0), minor=d.get("minor", 0))
        if "fileMode" in d:
            dev.file_mode.value = d["fileMode"]
        if "uid" in d:
            dev.uid.value = d["uid"]
        if "gid" in d:
            dev.gid.value = d["gid"]
    if "oomScoreAdj" in process:
        out.oom_score_adj.value = process["oomScoreAdj"]
    if prio := process.get("ioPriority"):
        out.io_priority.priority = prio.get("priority", 0)
        if prio.get("class") in api.IOPrioClass.DESCRIPTOR.values_by_name:
            setattr(out.io_priority, "class", api.IOPrioClass.Value(prio["class"]))
    sc = config.linux.security_context
    if sc.HasField("seccomp"):
        out.seccomp_profile.profile_type = _SECCOMP.get(
            sc.seccomp.profile_type, api.SecurityProfile.RUNTIME_DEFAULT)
        out.seccomp_profile.localhost_ref = sc.seccomp.localhost_ref
    return out


def oci_resources(r: Mapping[str, Any]) -> api.LinuxResources:
    """An OCI `linux.resources` object (the spec's, or an update pycri sends the runtime)."""
    out = api.LinuxResources()
    mem = r.get("memory", {})
    for oci, field in (("limit", "limit"), ("reservation", "reservation"), ("swap", "swap"),
                       ("kernel", "kernel"), ("kernelTCP", "kernel_tcp"),
                       ("swappiness", "swappiness"), ("disableOOMKiller", "disable_oom_killer"),
                       ("useHierarchy", "use_hierarchy")):
        if oci in mem:
            getattr(out.memory, field).value = mem[oci]
    cpu = r.get("cpu", {})
    for oci, field in (("shares", "shares"), ("quota", "quota"), ("period", "period"),
                       ("realtimeRuntime", "realtime_runtime"),
                       ("realtimePeriod", "realtime_period")):
        if oci in cpu:
            getattr(out.cpu, field).value = cpu[oci]
    out.cpu.cpus = cpu.get("cpus", "")
    out.cpu.mems = cpu.get("mems", "")
    for h in r.get("hugepageLimits", []):
        out.hugepage_limits.add(page_size=h["pageSize"], limit=h["limit"])
    out.unified.update(r.get("unified", {}))
    for d in r.get("devices", []):
        rule = out.devices.add(allow=d.get("allow", False), type=d.get("type", ""),
                               access=d.get("access", ""))
        if d.get("major") is not None:
            rule.major.value = d["major"]
        if d.get("minor") is not None:
            rule.minor.value = d["minor"]
    if "pids" in r:
        out.pids.limit = r["pids"].get("limit", 0)
    return out
