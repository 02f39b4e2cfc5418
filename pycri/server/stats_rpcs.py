"""RuntimeService stats RPCs: container and pod usage samples as CRI messages."""

from __future__ import annotations

import grpc

from pycri.api import api_pb2 as pb
from pycri.container.manager import ContainerManager, ContainerUsage, PodUsage
from pycri.server.errors import rpc

Ctx = grpc.aio.ServicerContext


def _u64(value: int) -> pb.UInt64Value:
    return pb.UInt64Value(value=value)


def container_stats(u: ContainerUsage) -> pb.ContainerStats:
    c, ts = u.container, u.timestamp
    return pb.ContainerStats(
        attributes=pb.ContainerAttributes(
            id=c.id, metadata=c.config.metadata, labels=c.config.labels,
            annotations=c.config.annotations,
        ),
        cpu=pb.CpuUsage(timestamp=ts, usage_core_nano_seconds=_u64(u.usage.cpu_ns),
                        usage_nano_cores=_u64(u.nano_cores)),
        memory=pb.MemoryUsage(
            timestamp=ts,
            working_set_bytes=_u64(u.usage.working_set_bytes),
            usage_bytes=_u64(u.usage.memory_bytes),
            rss_bytes=_u64(u.usage.rss_bytes),
            page_faults=_u64(u.usage.page_faults),
            major_page_faults=_u64(u.usage.major_page_faults),
        ),
        writable_layer=pb.FilesystemUsage(
            timestamp=ts,
            fs_id=pb.FilesystemIdentifier(mountpoint=u.mountpoint),
            used_bytes=_u64(u.writable_bytes),
            inodes_used=_u64(u.writable_inodes),
        ),
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
            cpu=pb.CpuUsage(timestamp=ts, usage_core_nano_seconds=_u64(p.usage.cpu_ns),
                            usage_nano_cores=_u64(p.nano_cores)),
            memory=pb.MemoryUsage(
                timestamp=ts,
                working_set_bytes=_u64(p.usage.working_set_bytes),
                usage_bytes=_u64(p.usage.memory_bytes),
                rss_bytes=_u64(p.usage.rss_bytes),
                page_faults=_u64(p.usage.page_faults),
                major_page_faults=_u64(p.usage.major_page_faults),
            ),
            network=pb.NetworkUsage(timestamp=ts, default_interface=default,
                                    interfaces=ifaces),
            process=pb.ProcessUsage(timestamp=ts, process_count=_u64(p.usage.processes)),
            containers=[container_stats(u) for u in p.containers],
        ),
    )


class StatsRPCs:
    containers: ContainerManager

    @rpc
    async def ContainerStats(
        self, request: pb.ContainerStatsRequest, context: Ctx
    ) -> pb.ContainerStatsResponse:
        return pb.ContainerStatsResponse(
            stats=container_stats(await self.containers.stats(request.container_id))
        )

    @rpc
    async def ListContainerStats(
        self, request: pb.ListContainerStatsRequest, context: Ctx
    ) -> pb.ListContainerStatsResponse:
        flt = request.filter if request.HasField("filter") else None
        return pb.ListContainerStatsResponse(
            stats=[container_stats(u) for u in await self.containers.list_stats(flt)]
        )

    @rpc
    async def PodSandboxStats(
        self, request: pb.PodSandboxStatsRequest, context: Ctx
    ) -> pb.PodSandboxStatsResponse:
        return pb.PodSandboxStatsResponse(
            stats=pod_stats(await self.containers.pod_stats(request.pod_sandbox_id))
        )

    @rpc
    async def ListPodSandboxStats(
        self, request: pb.ListPodSandboxStatsRequest, context: Ctx
    ) -> pb.ListPodSandboxStatsResponse:
        flt = request.filter if request.HasField("filter") else None
        return pb.ListPodSandboxStatsResponse(
            stats=[pod_stats(p) for p in await self.containers.list_pod_stats(flt)]
        )
