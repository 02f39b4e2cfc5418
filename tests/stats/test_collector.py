"""The stats collector over real managers (records only, no daemon) and real cgroups of
this host, each with a real process charged to it from its start, and a real writable
layer: what ContainerStats, PodSandboxStats and ListPodSandboxMetrics are built from."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from pycri.config import Config
from pycri.container.manager import ContainerManager
from pycri.events import EventBus
from pycri.image.manager import ImageManager
from pycri.launcher import Launcher
from pycri.monitor.reaper import Reaper
from pycri.network.cni import CNIManager
from pycri.nri.adaptation import Adaptation
from pycri.sandbox.manager import SandboxManager
from pycri.stats.collector import StatsCollector
from pycri.store import Store
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox
from tests.lib.cgrouptree import PURE_V2, ROOT, Cgroup

MiB = 1 << 20


@pytest.fixture
def cgroups() -> Iterator[list[Cgroup]]:
    """Cgroups made by the test, removed (their processes killed) afterwards, children
    first."""
    made: list[Cgroup] = []
    yield made
    for cg in reversed(made):
        cg.remove()


@dataclass
class Records:
    sandboxes: SandboxManager
    containers: ContainerManager
    collector: StatsCollector

    def pod(self, parent: str, pid: int, host_network: bool = False) -> Sandbox:
        cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", namespace="ns",
                                                                 uid=secrets.token_hex(4)))
        if host_network:
            cfg.linux.security_context.namespace_options.network = pb.NODE
        sb = Sandbox(id=secrets.token_hex(32), config=cfg, handler="runc", runtime_handler="",
                     created_at=time.time_ns(), state=pb.SANDBOX_READY, infra_pid=pid,
                     cgroup_parent=parent)
        self.sandboxes.sandboxes.put(sb)
        return sb

    def container(self, sb: Sandbox, cgroup: str, state: int, pid: int = 0) -> Container:
        c = Container(id=secrets.token_hex(32), sandbox_id=sb.id,
                      config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"),
                                                image=pb.ImageSpec(image="busybox")),
                      image_id="sha256:" + "0" * 64, image_ref="busybox", handler="runc",
                      created_at=time.time_ns(), log_path="", state=state, pid=pid,
                      started_at=time.time_ns(), cgroups_path=f"/{cgroup}",
                      resources={"memory_limit_in_bytes": str(64 * MiB)})
        self.containers.containers.put(c)  # as a create records it: by id and by pod
        return c

    def writable_layer(self, c: Container, size: int) -> int:
        """A real upper dir holding one file of `size` bytes; its allocated bytes."""
        upper = self.containers.images.snapshots.upper(c.id)
        upper.mkdir(parents=True)
        (upper / "data").write_bytes(b"x" * size)
        return (upper / "data").stat().st_blocks * 512


@pytest.fixture
def records(tmp_path: Path) -> Iterator[Records]:
    """The managers as the daemon wires them, with no record and nothing started."""
    cfg = Config(root=str(tmp_path / "root"), state=str(tmp_path / "state"))
    cfg.cni.conf_dir = str(tmp_path / "net.d")
    store = Store(cfg.db_path)
    images = ImageManager(tmp_path / "root", cfg.images, store)
    launcher = Launcher(cfg, Reaper())
    bus = EventBus()
    sandboxes = SandboxManager(cfg, store, launcher,
                               CNIManager.from_config(cfg.cni, tmp_path / "cni"), images, bus,
                               Adaptation(cfg.nri))
    containers = ContainerManager(cfg, store, launcher, sandboxes, images, bus)
    yield Records(sandboxes, containers, StatsCollector(sandboxes, containers))
    store.close()


def _cpu_ns(cg: Cgroup) -> int:
    if PURE_V2:
        stat = (ROOT / cg.rel / "cpu.stat").read_text().split()
        return int(stat[stat.index("usage_usec") + 1]) * 1000
    return int((ROOT / "cpuacct" / cg.rel / "cpuacct.usage").read_text())


def _spun_past(cg: Cgroup, cpu_ns: int) -> None:
    """Wait until the cgroup has used more CPU than `cpu_ns` (a loaded host may not run
    the spinner for a while)."""
    deadline = time.monotonic() + 10
    while _cpu_ns(cg) <= cpu_ns:
        assert time.monotonic() < deadline, "the spinner got no CPU"
        time.sleep(0.02)


async def test_container_sample_is_its_cgroup_and_writable_layer(
        records: Records, cgroups: list[Cgroup]) -> None:
    tag = secrets.token_hex(4)
    pod_cg, ctr_cg = Cgroup(f"pycri-test-{tag}"), Cgroup(f"pycri-test-{tag}/c")
    cgroups += [pod_cg, ctr_cg]
    pod_cg.make(128 * MiB)
    ctr_cg.make(64 * MiB)
    pid = ctr_cg.spin()
    sb = records.pod(f"/{pod_cg.rel}", pid)
    c = records.container(sb, ctr_cg.rel, pb.CONTAINER_RUNNING, pid)
    allocated = records.writable_layer(c, 3 * 4096)

    before = _cpu_ns(ctr_cg)
    first = await records.collector.container(c.id[:12])  # a prefix names it too
    after = _cpu_ns(ctr_cg)
    assert first.container is c and first.nano_cores == 0  # no previous sample
    assert before <= first.usage.cpu_ns <= after
    assert first.usage.processes == 1
    assert first.usage.memory_limit == 64 * MiB
    assert 0 < first.usage.working_set_bytes <= first.usage.memory_bytes
    assert (first.writable_bytes, first.writable_inodes) == (allocated, 1)
    assert first.mountpoint == str(records.containers.images.root)
    _spun_past(ctr_cg, first.usage.cpu_ns)
    second = (await records.collector.list_containers(None))[0]
    assert second.timestamp > first.timestamp
    assert second.usage.cpu_ns > first.usage.cpu_ns  # it spun meanwhile
    rate = (second.usage.cpu_ns - first.usage.cpu_ns) * 10**9 // (
        second.timestamp - first.timestamp)
    assert second.nano_cores == rate > 0


async def test_stopped_container_reads_zero_usage_but_keeps_its_layer(
        records: Records, cgroups: list[Cgroup]) -> None:
    cg = Cgroup(f"pycri-test-{secrets.token_hex(4)}")
    cgroups.append(cg)
    cg.make(64 * MiB)
    pid = cg.spin()  # a process still there: the record's state decides, not the cgroup
    sb = records.pod("", pid)
    c = records.container(sb, cg.rel, pb.CONTAINER_EXITED)
    allocated = records.writable_layer(c, 4096)
    u = await records.collector.container(c.id)
    assert (u.usage.cpu_ns, u.usage.processes, u.usage.memory_limit) == (0, 0, None)
    assert (u.writable_bytes, u.writable_inodes) == (allocated, 1)


async def test_pod_sums_its_containers_with_its_own_limit_and_network(
        records: Records, cgroups: list[Cgroup]) -> None:
    tag = secrets.token_hex(4)
    pod_cg, a_cg, b_cg = (Cgroup(f"pycri-test-{tag}"), Cgroup(f"pycri-test-{tag}/a"),
                          Cgroup(f"pycri-test-{tag}/b"))
    cgroups += [pod_cg, a_cg, b_cg]
    pod_cg.make(128 * MiB)
    a_cg.make(64 * MiB)
    b_cg.make(32 * MiB)
    a_pid, b_pid = a_cg.spin(netns=True), b_cg.spin()
    sb = records.pod(f"/{pod_cg.rel}", a_pid)
    a = records.container(sb, a_cg.rel, pb.CONTAINER_RUNNING, a_pid)
    b = records.container(sb, b_cg.rel, pb.CONTAINER_RUNNING, b_pid)
    gone = records.container(sb, b_cg.rel, pb.CONTAINER_EXITED)  # counted as zeros
    records.container(sb, b_cg.rel, pb.CONTAINER_UNKNOWN)  # left out until rechecked
    hostnet = records.pod("", b_pid, host_network=True)
    for c in (a, b, gone):
        records.writable_layer(c, 4096)

    [p] = await records.collector.list_pods(pb.PodSandboxStatsFilter(id=sb.id))
    assert p.sandbox is sb
    assert [u.container.id for u in p.containers] == [a.id, b.id, gone.id]
    mine = {u.container.id: u.usage for u in p.containers}
    assert p.usage.cpu_ns == mine[a.id].cpu_ns + mine[b.id].cpu_ns > 0
    assert p.usage.processes == 2
    assert p.usage.memory_bytes == mine[a.id].memory_bytes + mine[b.id].memory_bytes
    assert p.usage.memory_limit == 128 * MiB  # the pod's cgroup's, not a sum
    assert sorted(i.name for i in p.interfaces) == ["eth0", "eth1"]  # its infra's, no lo
    host = await records.collector.pod(hostnet.id)
    assert (host.interfaces, host.containers, host.usage.memory_limit) == ([], [], None)

    # ListPodSandboxMetrics: ready pods, their created and running containers only
    by_pod = {m.sandbox_id: m for m in await records.collector.pod_metrics()}
    assert set(by_pod) == {sb.id, hostnet.id}
    assert [m.container_id for m in by_pod[sb.id].containers] == [a.id, b.id]
    samples = {s.name: s for s in by_pod[sb.id].containers[0].samples}
    assert samples["container_processes"].value == 1
    assert samples["container_spec_memory_limit_bytes"].value == 64 * MiB
    assert samples["container_fs_usage_bytes"].value > 0
    assert samples["container_memory_usage_bytes"].labels[:4] == ("p", "ns", "c", a.id)
    # The image label names the image as people read it; no such image here: the request's.
    assert samples["container_memory_usage_bytes"].labels[4] == "busybox"


async def test_cpu_rate_memory_goes_with_the_record(
        records: Records, cgroups: list[Cgroup]) -> None:
    cg = Cgroup(f"pycri-test-{secrets.token_hex(4)}")
    cgroups.append(cg)
    cg.make(64 * MiB)
    pid = cg.spin()
    sb = records.pod("", pid)
    c = records.container(sb, cg.rel, pb.CONTAINER_RUNNING, pid)
    first = await records.collector.container(c.id)
    _spun_past(cg, first.usage.cpu_ns)
    second = await records.collector.container(c.id)
    assert second.nano_cores > 0
    records.containers.containers.drop(c)  # removed: the next sample forgets its rate
    assert await records.collector.list_containers(None) == []
    records.containers.containers.put(c)
    _spun_past(cg, second.usage.cpu_ns)  # a remembered sample would now give a rate
    assert (await records.collector.container(c.id)).nano_cores == 0
