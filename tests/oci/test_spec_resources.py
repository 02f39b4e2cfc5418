"""oci/spec/resources.py: cgroupsPath and linux.resources of a container."""

from __future__ import annotations

import pytest

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci.spec.resources import cgroups_path, resources_to_oci

from .specutil import build, container_config


def test_cgroups_path() -> None:
    assert build()["linux"]["cgroupsPath"] == "/kubepods/pod1/c1"
    assert cgroups_path("", "cgroupfs", "x") == "/pycri/x"
    assert cgroups_path("kubepods", "cgroupfs", "x") == "/kubepods/x"
    assert cgroups_path("kubepods-pod1.slice", "systemd", "x") == "kubepods-pod1.slice:pycri:x"
    assert cgroups_path("", "systemd", "x") == "system.slice:pycri:x"
    for parent, driver in (("/a/b", "systemd"), ("/a/../b", "cgroupfs"), ("", "nope")):
        with pytest.raises(InvalidArgument):
            cgroups_path(parent, driver, "x")


def test_resources_to_oci_full() -> None:
    r = pb.LinuxContainerResources(
        cpu_period=100000, cpu_quota=50000, cpu_shares=512, memory_limit_in_bytes=1 << 26,
        memory_swap_limit_in_bytes=1 << 27, cpuset_cpus="0-1", cpuset_mems="0",
        oom_score_adj=100,
    )  # fmt: skip
    r.hugepage_limits.add(page_size="2MB", limit=1 << 21)
    r.unified["memory.high"] = "1000000"
    assert resources_to_oci(r) == {
        "cpu": {"shares": 512, "quota": 50000, "period": 100000, "cpus": "0-1", "mems": "0"},
        "memory": {"limit": 1 << 26, "swap": 1 << 27},
        "hugepageLimits": [{"pageSize": "2MB", "limit": 1 << 21}],
        "unified": {"memory.high": "1000000"},
    }


def test_resources_to_oci_empty_and_in_spec() -> None:
    assert resources_to_oci(pb.LinuxContainerResources()) == {}
    cfg = container_config()
    cfg.linux.resources.memory_limit_in_bytes = 1 << 24
    assert build(cfg)["linux"]["resources"]["memory"] == {"limit": 1 << 24}
