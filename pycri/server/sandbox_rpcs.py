"""RuntimeService pod sandbox RPCs: CRI messages in, SandboxManager calls, CRI messages out."""

from __future__ import annotations

import time

import grpc

from pycri.api import api_pb2 as pb
from pycri.container.manager import ContainerManager
from pycri.container.model import Container
from pycri.sandbox.manager import SandboxManager
from pycri.sandbox.model import Sandbox
from pycri.server.errors import rpc
from pycri.server.itemcache import ItemCache
from pycri.server.streamed import streamed_list

Ctx = grpc.aio.ServicerContext


def sandbox_status(sb: Sandbox) -> pb.PodSandboxStatus:
    ips = sb.ips if sb.state == pb.SANDBOX_READY else []
    return pb.PodSandboxStatus(
        id=sb.id,
        metadata=sb.config.metadata,
        state=sb.state,  # type: ignore[arg-type]
        created_at=sb.created_at,
        network=pb.PodSandboxNetworkStatus(
            ip=ips[0] if ips else "",
            additional_ips=[pb.PodIP(ip=ip) for ip in ips[1:]],
        ),
        linux=pb.LinuxPodSandboxStatus(
            namespaces=pb.Namespace(
                options=sb.config.linux.security_context.namespace_options
            )
        ),
        labels=sb.config.labels,
        annotations=sb.config.annotations,
        runtime_handler=sb.runtime_handler,
    )


def sandbox_item(sb: Sandbox) -> pb.PodSandbox:
    return pb.PodSandbox(
        id=sb.id,
        metadata=sb.config.metadata,
        state=sb.state,  # type: ignore[arg-type]
        created_at=sb.created_at,
        labels=sb.config.labels,
        annotations=sb.config.annotations,
        runtime_handler=sb.runtime_handler,
    )


class SandboxRPCs:
    sandboxes: SandboxManager
    containers: ContainerManager
    _container_statuses: ItemCache[Container, pb.ContainerStatus]  # ContainerRPCs's
    _sandbox_items: ItemCache[Sandbox, pb.PodSandbox] = ItemCache(sandbox_item)
    _sandbox_statuses: ItemCache[Sandbox, pb.PodSandboxStatus] = ItemCache(sandbox_status)

    @rpc
    async def RunPodSandbox(
        self, request: pb.RunPodSandboxRequest, context: Ctx
    ) -> pb.RunPodSandboxResponse:
        sid = await self.sandboxes.run(request.config, request.runtime_handler)
        return pb.RunPodSandboxResponse(pod_sandbox_id=sid)

    @rpc
    async def StopPodSandbox(
        self, request: pb.StopPodSandboxRequest, context: Ctx
    ) -> pb.StopPodSandboxResponse:
        await self.sandboxes.stop(request.pod_sandbox_id)
        return pb.StopPodSandboxResponse()

    @rpc
    async def RemovePodSandbox(
        self, request: pb.RemovePodSandboxRequest, context: Ctx
    ) -> pb.RemovePodSandboxResponse:
        await self.sandboxes.remove(request.pod_sandbox_id)
        return pb.RemovePodSandboxResponse()

    @rpc
    async def PodSandboxStatus(
        self, request: pb.PodSandboxStatusRequest, context: Ctx
    ) -> pb.PodSandboxStatusResponse:
        sb = self.sandboxes.get(request.pod_sandbox_id)
        info = self.sandboxes.verbose_info(sb) if request.verbose else {}
        # The pod's container statuses as of `timestamp`: what the kubelet's evented PLEG
        # reads instead of a ContainerStatus per container.
        return pb.PodSandboxStatusResponse(
            status=self._sandbox_statuses.get(sb), info=info,
            containers_statuses=self._container_statuses.all(
                self.containers.known_of_sandbox(sb.id)),
            timestamp=time.time_ns(),
        )

    @rpc
    async def ListPodSandbox(
        self, request: pb.ListPodSandboxRequest, context: Ctx
    ) -> pb.ListPodSandboxResponse:
        flt = request.filter if request.HasField("filter") else None
        found = self.sandboxes.list(flt)
        return pb.ListPodSandboxResponse(
            items=self._sandbox_items.all(found)
        )

    @rpc
    async def UpdatePodSandboxResources(
        self, request: pb.UpdatePodSandboxResourcesRequest, context: Ctx
    ) -> pb.UpdatePodSandboxResourcesResponse:
        await self.sandboxes.update_resources(
            request.pod_sandbox_id,
            request.overhead if request.HasField("overhead") else None,
            request.resources if request.HasField("resources") else None,
        )
        return pb.UpdatePodSandboxResourcesResponse()

    StreamPodSandboxes = streamed_list(
        "StreamPodSandboxes", ListPodSandbox, pb.ListPodSandboxRequest, "items",
        pb.StreamPodSandboxesResponse, "pod_sandboxes",
    )
