"""Builders shared by the spec tests: a minimal valid CRI request and context."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.oci.spec.build import ContainerContext, container_spec
from pycri.oci.spec.image import ImageConfig
from pycri.oci.users import ResolvedUser

IMAGE = ImageConfig(entrypoint=("/entry",), cmd=("cmd1", "cmd2"), env=("A=img", "B=img"))

CTX = ContainerContext(
    container_id="c1",
    sandbox_id="s1",
    rootfs="/r/rootfs",
    user=ResolvedUser(0, 0, (0,)),
    net_ns="/run/netns/pod",
    ipc_ns="/proc/10/ns/ipc",
    uts_ns="/proc/10/ns/uts",
    pid_ns="/proc/10/ns/pid",
    hostname="podhost",
    hostname_path="/s/hostname",
    resolv_conf_path="/s/resolv.conf",
    hosts_path="/s/hosts",
    shm_path="/s/shm",
    cgroup_parent="/kubepods/pod1",
)


def sandbox_config() -> pb.PodSandboxConfig:
    sb = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="pod", namespace="ns", uid="uid-1"),
        hostname="podhost",
    )
    sb.linux.sysctls["net.ipv4.ip_unprivileged_port_start"] = "0"
    return sb


def container_config() -> pb.ContainerConfig:
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="ctr"),
        image=pb.ImageSpec(image="docker.io/library/busybox:latest"),
    )


def build(
    config: pb.ContainerConfig | None = None,
    sandbox: pb.PodSandboxConfig | None = None,
    image: ImageConfig = IMAGE,
    **ctx: Any,
) -> dict[str, Any]:
    return container_spec(
        config or container_config(), sandbox or sandbox_config(), image, replace(CTX, **ctx)
    )


def privileged_spec(**ctx: Any) -> dict[str, Any]:
    """A privileged container in a privileged pod."""
    cfg = container_config()
    sb = sandbox_config()
    cfg.linux.security_context.privileged = True
    sb.linux.security_context.privileged = True
    return build(cfg, sb, **ctx)


def mount_at(spec: dict[str, Any], dest: str) -> dict[str, Any]:
    found = [m for m in spec["mounts"] if m["destination"] == dest]
    assert len(found) == 1, f"{dest}: {found}"
    return found[0]
