"""Stats collection, the one place above the sandbox and container managers.

The managers hold lifecycle only. The collector picks their records on the event loop,
reads cgroups (through pycri/cgroups.py), /proc and writable layers with the readers
here (usage, netdev, metrics) in one worker thread per call, so a container with a
million files cannot stall every other RPC, and keeps the memory a CPU rate needs (each
container's previous sample), touched on the event loop alone. The stats and metrics
servicers call it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import posixpath
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pycri.api import api_pb2 as pb
from pycri.cgroups import CGROUP_ROOT, Pressure, relative_dir
from pycri.container.base import RUNNING_STATES
from pycri.container.manager import ContainerManager
from pycri.errors import InvalidArgument, NotFound
from pycri.oci import spec
from pycri.sandbox.manager import SandboxManager
from pycri.stats import metrics, netdev
from pycri.stats.usage import Usage, read_pod, read_usage
from pycri.stats.usage import add as add_usage
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox


@dataclass(frozen=True)
class ContainerUsage:
    """One stats sample of a container (ContainerStats / ListContainerStats)."""

    container: Container
    timestamp: int
    usage: Usage
    nano_cores: int  # CPU rate since the previous sample; 0 for the first one
    writable_bytes: int
    writable_inodes: int
    mountpoint: str


@dataclass(frozen=True)
class PodUsage:
    """One stats sample of a pod: its containers' usage summed, and its network."""

    sandbox: Sandbox
    timestamp: int
    usage: Usage
    nano_cores: int
    interfaces: list[netdev.Interface]
    containers: list[ContainerUsage]


@dataclass(frozen=True)
class _Reading:
    """What the worker thread read of one container: file reads only, no rate yet."""

    timestamp: int
    usage: Usage
    writable_bytes: int
    writable_inodes: int


@dataclass(frozen=True)
class _PodReading:
    interfaces: list[netdev.Interface]
    memory_limit: int | None  # the pod's own cgroup's
    pressure: Pressure


class StatsCollector:
    """Samples for ContainerStats, PodSandboxStats (and their lists) and
    ListPodSandboxMetrics, from the managers' records."""

    def __init__(self, sandboxes: SandboxManager, containers: ContainerManager,
                 cgroup_root: Path = CGROUP_ROOT) -> None:  # fmt: skip
        self.sandboxes = sandboxes
        self.containers = containers
        self.images = containers.images
        self.cgroup_root = cgroup_root
        self._cpu: dict[str, tuple[int, int]] = {}  # container id -> (time ns, cpu ns)

    # -- container and pod stats ------------------------------------------------------

    async def container(self, cid: str) -> ContainerUsage:
        return (await self._sample([self.containers.get(cid)]))[0]

    async def list_containers(self, flt: pb.ContainerStatsFilter | None) -> list[ContainerUsage]:
        return await self._sample(self.containers.list(flt))

    async def pod(self, sandbox_id: str) -> PodUsage:
        return (await self._pod_sample([self.sandboxes.get(sandbox_id)]))[0]

    async def list_pods(self, flt: pb.PodSandboxStatsFilter | None) -> list[PodUsage]:
        return await self._pod_sample(self.sandboxes.list(flt))

    async def _sample(self, found: list[Container]) -> list[ContainerUsage]:
        running = [c.state in RUNNING_STATES for c in found]
        readings = await asyncio.to_thread(self._read_all, found, running)
        return self._rates(found, readings)

    async def _pod_sample(self, pods: list[Sandbox]) -> list[PodUsage]:
        members = {sb.id: self.containers.known_of_sandbox(sb.id) for sb in pods}
        found = [c for sb in pods for c in members[sb.id]]
        running = [c.state in RUNNING_STATES for c in found]
        live = [sb.state == pb.SANDBOX_READY and not sb.host_network for sb in pods]
        cgroups = [self._pod_cgroup(sb) for sb in pods]

        def read() -> tuple[list[_Reading], list[_PodReading]]:
            return self._read_all(found, running), [
                self._read_pod(sb, alive, rel)
                for sb, alive, rel in zip(pods, live, cgroups, strict=True)
            ]

        readings, own = await asyncio.to_thread(read)
        by_id = {u.container.id: u for u in self._rates(found, readings)}
        out = []
        for sb, pod in zip(pods, own, strict=True):
            mine = [by_id[c.id] for c in members[sb.id]]
            summed = functools.reduce(add_usage, (u.usage for u in mine), Usage())
            out.append(PodUsage(
                sandbox=sb,
                timestamp=time.time_ns(),
                usage=replace(summed, memory_limit=pod.memory_limit, pressure=pod.pressure),
                nano_cores=sum(u.nano_cores for u in mine),
                interfaces=pod.interfaces,
                containers=mine,
            ))
        return out

    def _read_all(self, found: Sequence[Container], running: Sequence[bool]) -> list[_Reading]:
        return [self._read(c, r) for c, r in zip(found, running, strict=True)]

    def _read(self, c: Container, running: bool) -> _Reading:
        """In the worker thread: the cgroup (a stopped container's reads as zeros) and
        the writable layer."""
        now = time.time_ns()
        usage = read_usage(c.cgroups_path, self.cgroup_root) if running else Usage()
        try:
            used, inodes = self.images.rootfs_usage(c.id)
        except NotFound:  # the writable layer went with a reboot
            used = inodes = 0
        return _Reading(now, usage, used, inodes)

    def _read_pod(self, sb: Sandbox, live: bool, rel: str | None) -> _PodReading:
        """In the worker thread: the pod's network (a live netns only) and its own cgroup."""
        ifaces = netdev.interfaces(sb.infra_pid) if live else []
        limit, pressure = read_pod(rel, self.cgroup_root) if rel else (None, {})
        return _PodReading(ifaces, limit, pressure)

    def _rates(self, found: Sequence[Container], readings: Sequence[_Reading]
               ) -> list[ContainerUsage]:  # fmt: skip
        """On the event loop: add the CPU rate since each container's previous sample,
        remembered only for containers that still exist."""
        known = self.containers.containers
        for cid in self._cpu.keys() - known.keys():  # removed since the last sample
            del self._cpu[cid]
        mountpoint = str(self.images.root)
        out = []
        for c, r in zip(found, readings, strict=True):
            prev = self._cpu.get(c.id)
            if c.id in known:
                self._cpu[c.id] = (r.timestamp, r.usage.cpu_ns)
            nano_cores = 0
            if prev is not None and r.timestamp > prev[0] and r.usage.cpu_ns >= prev[1]:
                nano_cores = (r.usage.cpu_ns - prev[1]) * 10**9 // (r.timestamp - prev[0])
            out.append(ContainerUsage(c, r.timestamp, r.usage, nano_cores, r.writable_bytes,
                                      r.writable_inodes, mountpoint))
        return out

    def _pod_cgroup(self, sb: Sandbox) -> str | None:
        """The pod's own cgroup directory (relative to a hierarchy), the parent of its
        infra's; None when the pod has none (no cgroup_parent: the parent is shared)."""
        if not sb.cgroup_parent or sb.state != pb.SANDBOX_READY:
            return None
        try:
            infra = spec.cgroups_path(sb.cgroup_parent, self.containers.cfg.cgroup_driver,
                                      sb.id)
        except InvalidArgument:
            return None
        return posixpath.dirname(relative_dir(infra)) or None

    # -- cAdvisor-named metrics -------------------------------------------------------

    async def pod_metrics(self) -> list[metrics.PodMetrics]:
        """Every ready pod and its created/running containers (ListPodSandboxMetrics)."""
        pods = [
            (sb, [c for c in self.containers.of_sandbox(sb.id) if c.state in RUNNING_STATES])
            for sb in self.sandboxes.list(None) if sb.state == pb.SANDBOX_READY
        ]
        return await asyncio.to_thread(self._metrics, pods)

    def _metrics(self, pods: list[tuple[Sandbox, list[Container]]]) -> list[metrics.PodMetrics]:
        fs = metrics.filesystem(self.images.root)
        return [
            metrics.pod_metrics(sb, [(c, self._writable_bytes(c.id),
                                      self.images.display_name(c.image_id, c.config.image.image))
                                     for c in cs], fs, self.cgroup_root)
            for sb, cs in pods
        ]

    def _writable_bytes(self, cid: str) -> int:
        """For the metrics, 0 when the layer is gone (removed while being sampled, or lost
        with a reboot)."""
        with contextlib.suppress(NotFound, OSError):
            return self.images.rootfs_usage(cid)[0]
        return 0
