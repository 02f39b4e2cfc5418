"""UpdatePodSandboxResources end to end (issue 11): a pod cgroup pycri made takes the
new limits (and gives back one no longer set), a kubelet's cgroup_parent is never
written, and a refused resize (bad values, unknown pod, a limit the kernel will not
take) leaves the cgroup files and the recorded resources as they were."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.e2e.test_pod_resources import CG, OVERHEAD, RESOURCES, SLEEP, kube_parent, read

pytestmark = pytest.mark.e2e
__all__ = ["kube_parent"]  # the fixture, shared with the pod-resources tests

R = pb.LinuxContainerResources
MiB = 1 << 20


def limits(sid: str) -> dict[str, int]:
    cpu, mem = CG / "cpu" / "pycri" / f"pod-{sid}", CG / "memory" / "pycri" / f"pod-{sid}"
    return {"period": read(cpu / "cpu.cfs_period_us"), "quota": read(cpu / "cpu.cfs_quota_us"),
            "shares": read(cpu / "cpu.shares"), "memory": read(mem / "memory.limit_in_bytes")}


def recorded(node: Node, sid: str) -> dict[str, Any]:
    info = node.cri.runtime.PodSandboxStatus(
        pb.PodSandboxStatusRequest(pod_sandbox_id=sid, verbose=True)).info["info"]
    return json.loads(info)["podResources"]  # type: ignore[no-any-return]


def resize(node: Node, sid: str, **kw: R) -> None:
    node.cri.runtime.UpdatePodSandboxResources(
        pb.UpdatePodSandboxResourcesRequest(pod_sandbox_id=sid, **kw))  # type: ignore[arg-type]


def test_resize_reaches_the_pod_cgroup_pycri_made(node: Node) -> None:
    sid, cfg = node.run_pod("resize", linux=pb.LinuxPodSandboxConfig(
        resources=RESOURCES, overhead=OVERHEAD))
    node.run(sid, cfg, "app", SLEEP)
    assert limits(sid) == {"period": 100000, "quota": 60000, "shares": 612,
                           "memory": 104 * MiB}
    bigger = R(cpu_period=50000, cpu_quota=100000, cpu_shares=1024,
               memory_limit_in_bytes=200 * MiB)
    resize(node, sid, resources=bigger, overhead=OVERHEAD)
    # overhead's 10 ms per 100 ms is 5 ms per the pod's new 50 ms period
    assert limits(sid) == {"period": 50000, "quota": 105000, "shares": 1124,
                           "memory": 208 * MiB}
    assert recorded(node, sid)["resources"]["memoryLimitInBytes"] == str(200 * MiB)
    # a limit no longer set goes back to the kernel's default, overhead alone bounds nothing
    resize(node, sid, resources=R(cpu_shares=256), overhead=OVERHEAD)
    now = limits(sid)
    assert (now["quota"], now["shares"]) == (-1, 356)
    assert now["memory"] > 1 << 40
    # the record survives a restart
    node.restart()
    assert recorded(node, sid) == {"resources": {"cpuShares": "256"},
                                   "overhead": {"cpuPeriod": "100000", "cpuQuota": "10000",
                                                "cpuShares": "100",
                                                "memoryLimitInBytes": str(8 * MiB)}}


def test_refused_resize_changes_nothing(node: Node) -> None:
    sid, cfg = node.run_pod("refused", linux=pb.LinuxPodSandboxConfig(
        resources=RESOURCES, overhead=OVERHEAD))
    # 48 MiB of tmpfs pages the pod cannot give back (this host has no swap)
    cid = node.run(sid, cfg, "fill", ["sh", "-c",
                                      "dd if=/dev/zero of=/dev/shm/fill bs=1M count=48 && "
                                      "touch /dev/shm/done && sleep 1000"])
    for _ in range(100):
        if node.exec(cid, "test", "-e", "/dev/shm/done").exit_code == 0:
            break
    before, record = limits(sid), recorded(node, sid)
    cases = [
        ("0" * 64, {"resources": R(cpu_shares=2)}, grpc.StatusCode.NOT_FOUND, "not found"),
        (sid, {"resources": R(memory_limit_in_bytes=1024)}, grpc.StatusCode.INVALID_ARGUMENT,
         "resources.memory_limit_in_bytes"),
        (sid, {"resources": R(cpu_shares=2, cpuset_cpus="0")},
         grpc.StatusCode.INVALID_ARGUMENT, "resources.cpuset_cpus"),
        (sid, {"overhead": R(cpu_quota=5)}, grpc.StatusCode.INVALID_ARGUMENT,
         "overhead.cpu_quota"),
        # valid, but below what the pod holds: the kernel refuses the memory limit after
        # the cpu files were written, and those are written back
        (sid, {"resources": R(cpu_quota=20000, cpu_shares=2, memory_limit_in_bytes=16 * MiB)},
         grpc.StatusCode.FAILED_PRECONDITION, "memory.limit_in_bytes"),
    ]
    for target, kw, code, text in cases:
        with pytest.raises(grpc.RpcError) as e:
            resize(node, target, **kw)
        assert e.value.code() == code, e.value.details()
        assert text in (e.value.details() or "")
        assert limits(sid) == before
        assert recorded(node, sid) == record
    assert node.status(cid).state == pb.CONTAINER_RUNNING


def test_kubelets_cgroup_parent_is_recorded_not_written(node: Node, kube_parent: str) -> None:
    sid, _ = node.run_pod("kubelet", linux=pb.LinuxPodSandboxConfig(
        cgroup_parent=kube_parent, resources=RESOURCES, overhead=OVERHEAD))
    parent = kube_parent.lstrip("/")
    resize(node, sid, resources=R(cpu_quota=20000, cpu_period=100000,
                                  memory_limit_in_bytes=64 * MiB))
    assert read(CG / "cpu" / parent / "cpu.cfs_quota_us") == -1
    assert read(CG / "memory" / parent / "memory.limit_in_bytes") > 1 << 40
    assert recorded(node, sid) == {"resources": {"cpuPeriod": "100000", "cpuQuota": "20000",
                                                 "memoryLimitInBytes": str(64 * MiB)}}
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
