"""sandbox_spec(): the infra process that holds the pod's namespaces."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci.seccomp import default_profile
from pycri.oci.spec.build import SandboxContext, sandbox_spec
from pycri.oci.spec.capabilities import ALL_CAPABILITIES, DEFAULT_CAPABILITIES
from pycri.oci.spec.image import ImageConfig
from pycri.oci.spec.process import DEFAULT_PATH
from pycri.oci.users import ResolvedUser

from .specutil import mount_at, sandbox_config

CTX = SandboxContext(sandbox_id="s1", rootfs="/r/s1/rootfs", cgroup_parent="/kubepods/pod1")


def build(config: pb.PodSandboxConfig | None = None, **ctx: Any) -> dict[str, Any]:
    return sandbox_spec(config or sandbox_config(), replace(CTX, **ctx))


def ns_of(spec: dict[str, Any]) -> dict[str, str | None]:
    return {n["type"]: n.get("path") for n in spec["linux"]["namespaces"]}


def test_catatonit_infra() -> None:
    s = build()
    assert s["process"]["args"] == ["/catatonit", "-P"]
    assert s["process"]["env"] == [DEFAULT_PATH]
    assert s["process"]["cwd"] == "/"
    m = mount_at(s, "/catatonit")
    assert m["source"] == "/usr/bin/catatonit" and m["type"] == "bind"
    assert "ro" in m["options"]
    assert s["root"] == {"path": "/r/s1/rootfs", "readonly": False}


def test_relative_infra_binary_rejected() -> None:
    with pytest.raises(InvalidArgument, match="absolute"):
        build(infra_binary="catatonit")


def test_pause_image_infra() -> None:
    img = ImageConfig(entrypoint=("/pause",), env=("X=1",), working_dir="/w")
    s = build(image=img)
    assert s["process"]["args"] == ["/pause"]
    assert s["process"]["env"] == [DEFAULT_PATH, "X=1"]
    assert s["process"]["cwd"] == "/w"
    assert "/catatonit" not in [m["destination"] for m in s["mounts"]]
    with pytest.raises(InvalidArgument, match="no command"):
        build(image=ImageConfig())


def test_minimal_mounts() -> None:
    dests = [m["destination"] for m in build()["mounts"]]
    assert {"/proc", "/dev", "/dev/pts", "/dev/shm", "/sys"} <= set(dests)
    assert mount_at(build(shm_path="/s/shm"), "/dev/shm")["source"] == "/s/shm"


def test_new_namespaces_by_default() -> None:
    s = build()
    assert ns_of(s) == {"mount": None, "network": None, "uts": None, "ipc": None, "pid": None}
    assert s["hostname"] == "podhost"


def test_pinned_netns_joined() -> None:
    assert ns_of(build(net_ns="/run/netns/p1"))["network"] == "/run/netns/p1"


def test_host_namespaces() -> None:
    cfg = sandbox_config()
    o = cfg.linux.security_context.namespace_options
    o.network, o.pid, o.ipc = pb.NODE, pb.NODE, pb.NODE
    s = build(cfg, net_ns="/run/netns/ignored")
    assert ns_of(s) == {"mount": None}
    assert "hostname" not in s


def test_pid_container_mode_still_new_pid_ns() -> None:
    cfg = sandbox_config()
    cfg.linux.security_context.namespace_options.pid = pb.CONTAINER
    assert "pid" in ns_of(build(cfg))


def test_sysctls_cgroup_oom() -> None:
    s = build()
    assert s["linux"]["sysctl"] == {"net.ipv4.ip_unprivileged_port_start": "0"}
    assert s["linux"]["cgroupsPath"] == "/kubepods/pod1/s1"
    assert s["process"]["oomScoreAdj"] == -998
    assert build(min_oom_score_adj=0)["process"]["oomScoreAdj"] == 0
    sd = build(cgroup_driver="systemd", cgroup_parent="kubepods.slice")
    assert sd["linux"]["cgroupsPath"] == "kubepods.slice:pycri:s1"


def test_security_context() -> None:
    cfg = sandbox_config()
    cfg.linux.security_context.readonly_rootfs = True
    s = build(cfg, user=ResolvedUser(65535, 65535, (65535,)), seccomp=default_profile())
    assert s["root"]["readonly"] is True
    assert s["process"]["user"] == {"uid": 65535, "gid": 65535, "additionalGids": [65535]}
    assert s["process"]["capabilities"]["bounding"] == list(
        c for c in ALL_CAPABILITIES if c in DEFAULT_CAPABILITIES
    )
    assert s["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_ERRNO"
    assert s["linux"]["maskedPaths"] and s["linux"]["readonlyPaths"]
    assert s["linux"]["resources"]["devices"] == [{"allow": False, "access": "rwm"}]


def test_privileged_sandbox() -> None:
    cfg = sandbox_config()
    cfg.linux.security_context.privileged = True
    s = build(cfg, seccomp=default_profile())
    assert s["process"]["capabilities"]["bounding"] == list(ALL_CAPABILITIES)
    assert "seccomp" not in s["linux"] and "maskedPaths" not in s["linux"]
    assert s["linux"]["resources"]["devices"] == [{"allow": True, "access": "rwm"}]
    assert "rw" in mount_at(s, "/sys")["options"]


def test_apparmor_localhost_on_host_without_apparmor() -> None:
    cfg = sandbox_config()
    cfg.linux.security_context.apparmor.profile_type = pb.SecurityProfile.Localhost
    cfg.linux.security_context.apparmor.localhost_ref = "prof"
    with pytest.raises(InvalidArgument, match="AppArmor"):
        build(cfg)


def test_annotations() -> None:
    cfg = sandbox_config()
    cfg.annotations["a"] = "b"
    cfg.log_directory = "/var/log/pods/x"
    a = build(cfg)["annotations"]
    assert a["a"] == "b"
    assert a["io.kubernetes.cri.container-type"] == "sandbox"
    assert a["io.kubernetes.cri.sandbox-id"] == "s1"
    assert a["io.kubernetes.cri.sandbox-name"] == "pod"
    assert a["io.kubernetes.cri.sandbox-namespace"] == "ns"
    assert a["io.kubernetes.cri.sandbox-uid"] == "uid-1"
    assert a["io.kubernetes.cri.sandbox-log-directory"] == "/var/log/pods/x"
