"""Pod overhead and pod-level resources end to end (issue 15): the sandbox annotations in
the infra's config.json, the limit files of a pod cgroup pycri made itself, a kubelet's
cgroup_parent left alone, and refusals and failures that leave nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e

CG = Path("/sys/fs/cgroup")
R = pb.LinuxContainerResources
RESOURCES = R(cpu_period=100000, cpu_quota=50000, cpu_shares=512,
              memory_limit_in_bytes=96 << 20)
OVERHEAD = R(cpu_period=100000, cpu_quota=10000, cpu_shares=100,
             memory_limit_in_bytes=8 << 20)
SLEEP = ["sleep", "1000"]


def infra_spec(node: Node, sid: str) -> dict[str, object]:
    bundle = node.tmp / "state" / "bundles" / sid / "config.json"
    return json.loads(bundle.read_text())  # type: ignore[no-any-return]


def pod_dirs(sid: str) -> list[Path]:
    return list(CG.glob(f"*/pycri/pod-{sid}"))


def read(path: Path) -> int:
    return int(path.read_text().split()[0])


@pytest.fixture
def kube_parent() -> Iterator[str]:
    """A kubelet-style cgroup_parent; the runtime makes it, the test removes it."""
    name = f"pycri-e2e-kubepods-{os.getpid()}"
    yield f"/{name}/podabc"
    for h in CG.iterdir():
        for d in (h / name / "podabc", h / name):
            with contextlib.suppress(OSError):
                d.rmdir()


def test_pod_cgroup_pycri_makes_holds_resources_plus_overhead(node: Node) -> None:
    sid, cfg = node.run_pod("limited", linux=pb.LinuxPodSandboxConfig(
        resources=RESOURCES, overhead=OVERHEAD))
    spec = infra_spec(node, sid)
    ann = spec["annotations"]
    assert isinstance(ann, dict)
    assert ann["io.kubernetes.cri.sandbox-cpu-period"] == "100000"
    assert ann["io.kubernetes.cri.sandbox-cpu-quota"] == "50000"
    assert ann["io.kubernetes.cri.sandbox-cpu-shares"] == "512"
    assert ann["io.kubernetes.cri.sandbox-memory"] == str(96 << 20)
    pod = CG / "cpu" / "pycri" / f"pod-{sid}"
    assert read(pod / "cpu.cfs_period_us") == 100000
    assert read(pod / "cpu.cfs_quota_us") == 60000
    assert read(pod / "cpu.shares") == 612
    mem = CG / "memory" / "pycri" / f"pod-{sid}"
    assert read(mem / "memory.limit_in_bytes") == 104 << 20
    # the infra and the containers live below it, so the bound covers all of them
    linux = spec["linux"]
    assert isinstance(linux, dict)
    assert linux["cgroupsPath"] == f"/pycri/pod-{sid}/{sid}"
    cid = node.run(sid, cfg, "app", SLEEP)
    assert (mem / cid / "memory.limit_in_bytes").is_file()
    # the pod's stats take its limit from this cgroup: available = limit - working set
    stats = node.cri.runtime.PodSandboxStats(
        pb.PodSandboxStatsRequest(pod_sandbox_id=sid)).stats.linux.memory
    assert stats.HasField("available_bytes")
    assert stats.available_bytes.value + stats.working_set_bytes.value == 104 << 20
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    assert pod_dirs(sid) == []


def test_kubelets_cgroup_parent_is_never_written(node: Node, kube_parent: str) -> None:
    sid, _ = node.run_pod("kubelet", linux=pb.LinuxPodSandboxConfig(
        cgroup_parent=kube_parent, resources=RESOURCES, overhead=OVERHEAD))
    ann = infra_spec(node, sid)["annotations"]
    assert isinstance(ann, dict)
    assert ann["io.kubernetes.cri.sandbox-memory"] == str(96 << 20)
    parent = kube_parent.lstrip("/")
    assert read(CG / "cpu" / parent / "cpu.cfs_quota_us") == -1
    assert read(CG / "cpu" / parent / "cpu.shares") == 1024
    assert read(CG / "memory" / parent / "memory.limit_in_bytes") > 1 << 40
    assert pod_dirs(sid) == []
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))


@pytest.mark.parametrize(("limit", "said"), [
    (1024, "config.linux.resources.memory_limit_in_bytes"),  # the gate: below a page
    (1 << 20, "memory limit too low"),  # runc's: its init cannot start in 1 MiB
])
def test_invalid_pod_limit_is_refused_with_nothing_created(
        node: Node, limit: int, said: str) -> None:
    cfg = node.pod_config("bad", linux=pb.LinuxPodSandboxConfig(
        resources=R(memory_limit_in_bytes=limit)))
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert said in (e.value.details() or "")
    assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
    sandboxes = node.tmp / "root" / "sandboxes"
    assert not sandboxes.exists() or not list(sandboxes.iterdir())
    assert not list((node.tmp / "state").glob("bundles/*"))


def test_failed_run_removes_the_pod_cgroup(node: Node) -> None:
    node.add_runtime("nostart", '#!/bin/sh\ncase " $* " in *" start "*) exit 1;; esac\n'
                                'exec /usr/sbin/runc "$@"\n')
    cfg = node.pod_config("nostart", linux=pb.LinuxPodSandboxConfig(
        resources=RESOURCES, overhead=OVERHEAD))
    before = set(CG.glob("*/pycri/pod-*"))
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg,
                                                               runtime_handler="nostart"))
    assert "starting the infra container" in (e.value.details() or "")
    assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
    assert set(CG.glob("*/pycri/pod-*")) == before
