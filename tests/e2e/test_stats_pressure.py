"""PSI, swap and available memory in the CRI stats of real containers and pods (this
host is hybrid: the pressure files live on the v2 mount beside the v1 controllers), and
what `crictl stats -o json` makes of them."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.lib import tools

pytestmark = pytest.mark.e2e

MiB = 1 << 20
CGROUPS = Path("/sys/fs/cgroup")
CRICTL_JSON = "crictl JSON output"
# Four spinners on a fifth of a CPU: they wait for CPU almost all the time, so the
# container's cpu pressure grows while it costs the (shared) machine little.
BURN = ["sh", "-c", "for i in 1 2 3 4; do (while :; do :; done) & done; wait"]
LIMITS = pb.LinuxContainerResources(cpu_period=100000, cpu_quota=20000,
                                    memory_limit_in_bytes=64 * MiB,
                                    memory_swap_limit_in_bytes=96 * MiB)


def stats(node: Node, cid: str) -> pb.ContainerStats:
    return node.cri.runtime.ContainerStats(pb.ContainerStatsRequest(container_id=cid)).stats


def run_pod(node: Node, name: str, handler: str = "", **kw: object) -> tuple[str,
                                                                            pb.PodSandboxConfig]:
    cfg = node.pod_config(name, **kw)
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=cfg, runtime_handler=handler)).pod_sandbox_id
    return sid, cfg


def assert_psi(psi: pb.PsiStats, full: bool = True) -> None:
    assert psi.HasField("Some")
    assert psi.HasField("Full") == full


@pytest.mark.parametrize("handler", ["runc", "crun"])
def test_container_pressure_swap_and_available_memory(node: Node, handler: str) -> None:
    sid, pod = run_pod(node, f"psi-{handler}", handler)
    busy = node.run(sid, pod, "busy", BURN, linux=pb.LinuxContainerConfig(resources=LIMITS))
    free = node.run(sid, pod, "free", ["sleep", "1000"])
    time.sleep(1)
    first = stats(node, busy)
    time.sleep(1.5)
    second = stats(node, busy)

    for s in (first, second):
        assert_psi(s.cpu.psi)
        assert_psi(s.memory.psi)
        assert_psi(s.io.psi)
        assert s.io.timestamp > 0 and s.swap.timestamp > 0
    # CPU pressure grows, in nanoseconds (the kernel's microseconds times 1000).
    assert second.cpu.psi.Some.Total > first.cpu.psi.Some.Total > 0
    assert second.cpu.psi.Some.Total - first.cpu.psi.Some.Total > 10**8  # > 0.1 s of waiting
    assert first.cpu.psi.Some.Total % 1000 == 0
    assert 0 < second.cpu.psi.Some.Avg10 <= 100
    assert second.cpu.psi.Some.Total >= second.cpu.psi.Full.Total
    # Limit 64 MiB, memory + swap 96 MiB: 32 MiB of swap, none used (this host has none).
    mem = second.memory
    assert mem.HasField("available_bytes")
    assert mem.available_bytes.value == 64 * MiB - mem.working_set_bytes.value
    assert second.swap.HasField("swap_usage_bytes") and second.swap.swap_usage_bytes.value == 0
    assert second.swap.swap_available_bytes.value == 32 * MiB

    # No limit: nothing is available "out of" it, so the fields are absent, not zero.
    unlimited = stats(node, free)
    assert not unlimited.memory.HasField("available_bytes")
    assert unlimited.swap.HasField("swap_usage_bytes")
    assert not unlimited.swap.HasField("swap_available_bytes")
    assert_psi(unlimited.cpu.psi)

    listed = {s.attributes.id: s for s in node.cri.runtime.ListContainerStats(
        pb.ListContainerStatsRequest()).stats}
    assert listed[busy].cpu.psi.Some.Total >= second.cpu.psi.Some.Total
    assert listed[busy].memory.available_bytes.value > 0
    assert listed[busy].swap.swap_available_bytes.value == 32 * MiB


def test_exited_container_has_no_pressure(node: Node) -> None:
    sid, pod = run_pod(node, "gone")
    cid = node.run(sid, pod, "gone", ["true"])
    deadline = time.monotonic() + 10
    while node.status(cid).state != pb.CONTAINER_EXITED:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    s = stats(node, cid)
    assert not s.cpu.HasField("psi") and not s.memory.HasField("psi")
    assert not s.HasField("io") and not s.HasField("swap")


@pytest.fixture
def pod_cgroup(node: Node) -> Iterator[str]:
    """A pod cgroup with a 256 MiB limit, as the kubelet makes before RunPodSandbox;
    removed from every hierarchy afterwards (once the node's pods are gone)."""
    parent = f"/pycri-e2e-{secrets.token_hex(3)}"
    (CGROUPS / "memory" / parent.lstrip("/")).mkdir()
    (CGROUPS / "memory" / parent.lstrip("/") / "memory.limit_in_bytes").write_text(
        str(256 * MiB))
    try:
        yield parent
    finally:
        node.remove_all()
        for h in CGROUPS.iterdir():
            d = h / parent.lstrip("/")
            if d.is_dir():
                os.rmdir(d)


def test_pod_pressure_and_available_memory(node: Node, pod_cgroup: str) -> None:
    sid, pod = run_pod(node, "podpsi", linux=pb.LinuxPodSandboxConfig(cgroup_parent=pod_cgroup))
    node.run(sid, pod, "busy", BURN, linux=pb.LinuxContainerConfig(resources=LIMITS))
    node.run(sid, pod, "idle", ["sleep", "1000"])
    assert (CGROUPS / "unified" / pod_cgroup.lstrip("/") / "cpu.pressure").is_file()
    time.sleep(1)
    first = node.cri.runtime.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=sid)).stats
    time.sleep(1.5)
    listed = node.cri.runtime.ListPodSandboxStats(pb.ListPodSandboxStatsRequest()).stats
    second = next(s for s in listed if s.attributes.id == sid)
    for linux in (first.linux, second.linux):
        assert_psi(linux.cpu.psi)
        assert_psi(linux.memory.psi)
        assert_psi(linux.io.psi)
        mem = linux.memory
        assert mem.available_bytes.value == 256 * MiB - mem.working_set_bytes.value
        assert len(linux.containers) == 2
    assert second.linux.cpu.psi.Some.Total > first.linux.cpu.psi.Some.Total > 0
    busy = next(c for c in second.linux.containers if c.attributes.metadata.name == "busy")
    assert busy.cpu.psi.Some.Total > 0 and busy.swap.swap_available_bytes.value == 32 * MiB

    # A pod without a cgroup of its own (crictl runp: the parent is shared) has no
    # pod-level pressure or limit; its containers still have theirs.
    other, opod = run_pod(node, "nocg")
    node.run(other, opod, "c", ["sleep", "1000"])
    linux = node.cri.runtime.PodSandboxStats(
        pb.PodSandboxStatsRequest(pod_sandbox_id=other)).stats.linux
    assert not linux.cpu.HasField("psi") and not linux.HasField("io")
    assert not linux.memory.HasField("available_bytes")
    assert_psi(linux.containers[0].cpu.psi)


@tools.needs("crictl", CRICTL_JSON)
def test_crictl_stats_json(node: Node) -> None:
    sid, pod = run_pod(node, "crictl")
    cid = node.run(sid, pod, "busy", BURN, linux=pb.LinuxContainerConfig(resources=LIMITS))
    time.sleep(1)
    crictl = tools.require("crictl", CRICTL_JSON)
    out = subprocess.run(
        [crictl, "--runtime-endpoint", f"unix://{node.proc.socket}", "stats", "-o", "json",
         "--id", cid], capture_output=True, text=True, timeout=60, check=True).stdout
    [s] = json.loads(out)["stats"]
    assert s["attributes"]["id"] == cid
    assert int(s["cpu"]["psi"]["Some"]["Total"]) > 0
    assert {"Avg10", "Avg60", "Avg300", "Total"} <= set(s["cpu"]["psi"]["Full"])
    assert "Some" in s["memory"]["psi"] and "Some" in s["io"]["psi"]
    mem = s["memory"]
    assert int(mem["availableBytes"]["value"]) == 64 * MiB - int(mem["workingSetBytes"]["value"])
    assert int(s["swap"]["swapAvailableBytes"]["value"]) == 32 * MiB
    assert int(s["swap"]["swapUsageBytes"]["value"]) == 0
