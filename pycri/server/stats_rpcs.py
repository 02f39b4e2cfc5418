"""RuntimeService stats RPCs: container and pod usage samples as CRI messages."""

from __future__ import annotations

import grpc

from pycri.api import api_pb2 as pb
from pycri.cgroups import Pressure
from pycri.server.errors import rpc
from pycri.server.streamed import streamed_list
from pycri.stats.collector import ContainerUsage, PodUsage, StatsCollector
from pycri.stats.usage import Usage

Ctx = grpc.aio.ServicerContext


def _u64(value: int) -> pb.UInt64Value:
    return pb.UInt64Value(value=value)


def _opt_u64(value: int | None) -> pb.UInt64Value | None:
    """Absent, not zero, when the host does not provide the value."""
    return None if value is None else pb.UInt64Value(value=value)


def _psi(pressure: Pressure, resource: str) -> pb.PsiStats | None:
    """PSI of one resource; the kernel counts microseconds, the CRI nanoseconds."""
    lines = pressure.get(resource)
    if not lines:
        return None
    data = {kind.capitalize(): pb.PsiData(Total=line.total_us * 1000, Avg10=line.avg10,
                                          Avg60=line.avg60, Avg300=line.avg300)
            for kind, line in lines.items() if kind in ("some", "full")}
    return pb.PsiStats(**data)


def _cpu(ts: int, usage: Usage, nano_cores: int) -> pb.CpuUsage:
    return pb.CpuUsage(timestamp=ts, usage_core_nano_seconds=_u64(usage.cpu_ns),
                       usage_nano_cores=_u64(nano_cores), psi=_psi(usage.pressure, "cpu"))


def _memory(ts: int, usage: Usage) -> pb.MemoryUsage:
    """The same fields for a container and for a pod (its containers' usage summed; its
    limit and pressure its own cgroup's)."""
    return pb.MemoryUsage(
        timestamp=ts,
        working_set_bytes=_u64(usage.working_set_bytes),
        available_bytes=_opt_u64(usage.available_bytes),
        usage_bytes=_u64(usage.memory_bytes),
        rss_bytes=_u64(usage.rss_bytes),
        page_faults=_u64(usage.page_faults),
        major_page_faults=_u64(usage.major_page_faults),
        psi=_psi(usage.pressure, "memory"),
    )


def _io(ts: int, usage: Usage) -> pb.IoUsage | None:
    psi = _psi(usage.pressure, "io")
    return None if psi is None else pb.IoUsage(timestamp=ts, psi=psi)


def _swap(ts: int, usage: Usage) -> pb.SwapUsage | None:
    if usage.swap_bytes is None:
        return None
    return pb.SwapUsage(timestamp=ts, swap_usage_bytes=_u64(usage.swap_bytes),
                        swap_available_bytes=_opt_u64(usage.swap_available_bytes))


def container_stats(u: ContainerUsage) -> pb.ContainerStats:
    c, ts = u.container, u.timestamp
    return pb.ContainerStats(
        attributes=pb.ContainerAttributes(
            id=c.id, metadata=c.config.metadata, labels=c.config.labels,
            annotations=c.config.annotations,
        ),
        cpu=_cpu(ts, u.usage, u.nano_cores),
        memory=_memory(ts, u.usage),
        writable_layer=pb.FilesystemUsage(
            timestamp=ts,
            fs_id=pb.FilesystemIdentifier(mountpoint=u.mountpoint),
            used_bytes=_u64(u.writable_bytes),
            inodes_used=_u64(u.writable_inodes),
        ),
        swap=_swap(ts, u.usage),
        io=_io(ts, u.usage),
    )


def pod_stats(p: PodUsage) -> pb.PodSandboxStats:
    sb, ts = p.sandbox, p.timestamp
    ifaces = [
        pb.NetworkInterfaceUsage(name=i.name, rx_bytes=_u64(i.rx_bytes),
                                 rx_errors=_u64(i.rx_errors), tx_bytes=_u64(i.tx_bytes),
                                 tx_errors=_u64(i.tx_errors))
        for i in p.interfaces
    ]
    default = next((i for i in ifaces if i.name == "eth0"), ifaces[0] if ifaces else None)
    return pb.PodSandboxStats(
        attributes=pb.PodSandboxAttributes(
            id=sb.id, metadata=sb.config.metadata, labels=sb.config.labels,
            annotations=sb.config.annotations,
        ),
        linux=pb.LinuxPodSandboxStats(
            cpu=_cpu(ts, p.usage, p.nano_cores),
            memory=_memory(ts, p.usage),
            network=pb.NetworkUsage(timestamp=ts, default_interface=default,
                                    interfaces=ifaces),
            process=pb.ProcessUsage(timestamp=ts, process_count=_u64(p.usage.processes)),
            containers=[container_stats(u) for u in p.containers],
            io=_io(ts, p.usage),
        ),
    )


class StatsRPCs:
    stats: StatsCollector

    @rpc
    async def ContainerStats(
        self, request: pb.ContainerStatsRequest, context: Ctx
    ) -> pb.ContainerStatsResponse:
        return pb.ContainerStatsResponse(
            stats=container_stats(await self.stats.container(request.container_id))
        )

    @rpc
    async def ListContainerStats(
        self, request: pb.ListContainerStatsRequest, context: Ctx
    ) -> pb.ListContainerStatsResponse:
        flt = request.filter if request.HasField("filter") else None
        return pb.ListContainerStatsResponse(
            stats=[container_stats(u) for u in await self.stats.list_containers(flt)]
        )

    StreamContainerStats = streamed_list(
        "StreamContainerStats", ListContainerStats, pb.ListContainerStatsRequest, "stats",
        pb.StreamContainerStatsResponse, "container_stats",
    )

    @rpc
    async def PodSandboxStats(
        self, request: pb.PodSandboxStatsRequest, context: Ctx
    ) -> pb.PodSandboxStatsResponse:
        return pb.PodSandboxStatsResponse(
            stats=pod_stats(await self.stats.pod(request.pod_sandbox_id))
        )

    @rpc
    async def ListPodSandboxStats(
        self, request: pb.ListPodSandboxStatsRequest, context: Ctx
    ) -> pb.ListPodSandboxStatsResponse:
        flt = request.filter if request.HasField("filter") else None
        return pb.ListPodSandboxStatsResponse(
            stats=[pod_stats(p) for p in await self.stats.list_pods(flt)]
        )

    StreamPodSandboxStats = streamed_list(
        "StreamPodSandboxStats", ListPodSandboxStats, pb.ListPodSandboxStatsRequest, "stats",
        pb.StreamPodSandboxStatsResponse, "pod_sandbox_stats",
    )
