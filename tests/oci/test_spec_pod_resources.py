"""Pod overhead and pod-level resources in the pure spec generator: the sandbox
annotations a VM-based handler reads, and the limits of a pod cgroup pycri makes."""

from __future__ import annotations

from pycri.api import api_pb2 as pb
from pycri.oci.spec.build import SandboxContext, sandbox_spec
from pycri.oci.spec.resources import MAX_CPU_QUOTA, pod_limits

from .specutil import sandbox_config

CTX = SandboxContext(sandbox_id="s1", rootfs="/r/s1/rootfs", cgroup_parent="/kubepods/pod1")
R = pb.LinuxContainerResources


def linux(resources: R | None = None, overhead: R | None = None) -> pb.LinuxPodSandboxConfig:
    out = pb.LinuxPodSandboxConfig()
    if resources is not None:
        out.resources.CopyFrom(resources)
    if overhead is not None:
        out.overhead.CopyFrom(overhead)
    return out


def test_resources_become_containerds_sandbox_annotations() -> None:
    cfg = sandbox_config()
    cfg.linux.resources.CopyFrom(R(cpu_period=100000, cpu_quota=50000, cpu_shares=512,
                                   memory_limit_in_bytes=64 << 20))
    cfg.linux.overhead.CopyFrom(R(cpu_shares=10, memory_limit_in_bytes=1 << 20))
    ann = sandbox_spec(cfg, CTX)["annotations"]
    assert ann["io.kubernetes.cri.sandbox-cpu-period"] == "100000"
    assert ann["io.kubernetes.cri.sandbox-cpu-quota"] == "50000"
    assert ann["io.kubernetes.cri.sandbox-cpu-shares"] == "512"
    assert ann["io.kubernetes.cri.sandbox-memory"] == str(64 << 20)
    # the limits stay out of the infra's own cgroup: the kubelet owns the pod's
    assert set(sandbox_spec(cfg, CTX)["linux"]["resources"]) == {"devices"}


def test_no_resources_no_annotations() -> None:
    ann = sandbox_spec(sandbox_config(), CTX)["annotations"]
    assert not [k for k in ann if k.startswith("io.kubernetes.cri.sandbox-cpu")]
    assert "io.kubernetes.cri.sandbox-memory" not in ann


def test_pod_limits_add_the_overhead() -> None:
    got = pod_limits(linux(
        R(cpu_period=100000, cpu_quota=200000, cpu_shares=2048, memory_limit_in_bytes=256 << 20),
        R(cpu_period=50000, cpu_quota=5000, cpu_shares=256, memory_limit_in_bytes=32 << 20)))
    # overhead's quota is rescaled to the pod's period: 5000/50000 = 10000/100000
    assert got == {"cpu": {"shares": 2304, "quota": 210000, "period": 100000},
                   "memory": {"limit": 288 << 20}}


def test_pod_limits_unset_stay_unset() -> None:
    assert pod_limits(linux()) == {}
    # overhead alone bounds nothing: the workload is unlimited
    assert pod_limits(linux(None, R(cpu_shares=256, memory_limit_in_bytes=32 << 20))) == {}
    # kubelet's "no CPU limit" (quota -1) and no memory limit: shares only
    assert pod_limits(linux(R(cpu_period=100000, cpu_quota=-1, cpu_shares=2))) == {
        "cpu": {"shares": 2}}


def test_pod_limits_stay_within_what_the_kernel_takes() -> None:
    """The largest quota and memory the gate lets through, plus the largest overhead,
    still give values the kernel takes (tests/sandbox/test_podcgroup.py writes them)."""
    big = R(cpu_period=1000, cpu_quota=MAX_CPU_QUOTA, memory_limit_in_bytes=2**63 - 1)
    got = pod_limits(linux(big, big))
    assert got == {"cpu": {"quota": MAX_CPU_QUOTA, "period": 1000},
                   "memory": {"limit": 2**63 - 1}}


def test_pod_limits_default_period_and_share_cap() -> None:
    got = pod_limits(linux(R(cpu_quota=30000, cpu_shares=262144), R(cpu_shares=100)))
    assert got == {"cpu": {"shares": 262144, "quota": 30000, "period": 100000}}
