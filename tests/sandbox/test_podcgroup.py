"""sandbox/podcgroup.py file formats and its guard, on a directory laid out like a
cgroup root (the real cgroup v1 files are written in tests/e2e/test_pod_resources.py;
this host has no pure v2 hierarchy to write to)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from pycri.cgroups import CGROUP_ROOT, Cgroup
from pycri.oci.spec.resources import MAX_CPU_QUOTA, pod_limits
from pycri.sandbox import podcgroup

LIMITS = {"cpu": {"shares": 1024, "quota": 50000, "period": 100000},
          "memory": {"limit": 64 << 20}}


def test_v2_files_and_delegation(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    podcgroup.create(podcgroup.path_for("s1"), LIMITS, root=tmp_path)
    pod = tmp_path / "pycri" / "pod-s1"
    assert (pod / "cpu.max").read_text() == "50000 100000"
    assert (pod / "cpu.weight").read_text() == "39"  # runc's mapping of 1024 shares
    assert (pod / "memory.max").read_text() == str(64 << 20)
    # the root and /pycri delegate cpu and memory, or the files would not exist
    for d in (tmp_path, tmp_path / "pycri"):
        assert (d / "cgroup.subtree_control").read_text() == "+cpu +memory"


def test_v2_unified_files(tmp_path: Path) -> None:
    """A kubelet >= 1.32 on cgroup v2 asks for memory.oom.group on the pod (issue 25)."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    limits = {"memory": {"limit": 64 << 20}, "unified": {"memory.oom.group": "1"}}
    podcgroup.create(podcgroup.path_for("s1"), limits, root=tmp_path)
    assert (tmp_path / "pycri" / "pod-s1" / "memory.oom.group").read_text() == "1"


def test_v1_has_no_unified_files(tmp_path: Path) -> None:
    podcgroup.create(podcgroup.path_for("s1"), {"unified": {"memory.oom.group": "1"}},
                     root=tmp_path)
    assert not list(tmp_path.rglob("memory.oom.group"))


def test_v1_files(tmp_path: Path) -> None:
    podcgroup.create(podcgroup.path_for("s1"), {"memory": {"limit": 1 << 30}}, root=tmp_path)
    assert (tmp_path / "memory/pycri/pod-s1/memory.limit_in_bytes").read_text() == str(1 << 30)
    assert not (tmp_path / "cpu").exists()  # nothing asked of the cpu controller


def test_remove_only_the_pods_own(tmp_path: Path) -> None:
    for h in ("cpu", "memory", "pids"):
        (tmp_path / h / "pycri" / "pod-s1").mkdir(parents=True)
    podcgroup.remove("/pycri", "s1", root=tmp_path)  # a bad record: never a parent
    podcgroup.remove(podcgroup.path_for("s2"), "s1", root=tmp_path)
    assert len(list(tmp_path.glob("*/pycri/pod-s1"))) == 3
    podcgroup.remove(podcgroup.path_for("s1"), "s1", root=tmp_path)
    assert list(tmp_path.glob("*/pycri/pod-s1")) == []
    podcgroup.remove(podcgroup.path_for("s1"), "s1", root=tmp_path)  # gone is fine


def test_update_writes_new_limits_and_resets_the_unset(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    podcgroup.create(podcgroup.path_for("s1"), LIMITS, root=tmp_path)
    podcgroup.update(podcgroup.path_for("s1"), {"cpu": {"shares": 2}}, root=tmp_path)
    pod = tmp_path / "pycri" / "pod-s1"
    assert (pod / "cpu.weight").read_text() == "1"
    assert (pod / "cpu.max").read_text() == "max"
    assert (pod / "memory.max").read_text() == "max"


def test_update_v1_touches_only_existing_controllers(tmp_path: Path) -> None:
    podcgroup.create(podcgroup.path_for("s1"), {"memory": {"limit": 1 << 30}}, root=tmp_path)
    podcgroup.update(podcgroup.path_for("s1"), {"cpu": {"quota": 5000, "period": 10000},
                                                "memory": {"limit": 1 << 29}}, root=tmp_path)
    assert (tmp_path / "memory/pycri/pod-s1/memory.limit_in_bytes").read_text() == str(1 << 29)
    assert not (tmp_path / "cpu").exists()


def test_the_largest_limits_the_gate_allows_are_written_to_real_cgroups() -> None:
    """The RPC fuzzer's finding: a pod quota of 2^63-1 µs was an UNKNOWN "creating the
    pod cgroup: Invalid argument". The gate now stops at the kernel's bound; the largest
    pod_limits that passes it (plus the largest overhead) is taken by this kernel."""
    if os.geteuid() != 0 or not CGROUP_ROOT.is_dir():
        pytest.skip("not exercised: writing real cgroups needs root and /sys/fs/cgroup")
    big = pb.LinuxContainerResources(cpu_period=1000, cpu_quota=MAX_CPU_QUOTA,
                                     memory_limit_in_bytes=2**63 - 1)
    limits = pod_limits(pb.LinuxPodSandboxConfig(resources=big, overhead=big))
    sandbox_id = f"fuzz-{os.getpid()}"
    path = podcgroup.path_for(sandbox_id)
    try:
        podcgroup.create(path, limits, root=CGROUP_ROOT)
        cg = Cgroup(path.lstrip("/"), CGROUP_ROOT)
        quota = Path(cg.file("cpu", "cpu.cfs_quota_us", "cpu.max")).read_text().split()[0]
        assert quota == str(MAX_CPU_QUOTA)
    finally:
        podcgroup.remove(path, sandbox_id, root=CGROUP_ROOT)
    assert not [d for d in Cgroup(path.lstrip("/"), CGROUP_ROOT).dirs() if d.exists()]
