"""RuntimeService pod sandbox RPCs: CRI messages in, SandboxManager calls, CRI messages out."""

from __future__ import annotations

import time

import grpc

from pycri.api import api_pb2 as pb
from pycri.container.manager import ContainerManager
from pycri.sandbox.manager import SandboxManager
from pycri.server.errors import rpc
from pycri.server.itemcache import ItemCache
from pycri.server.streamed import streamed_list
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox

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


def _listed(sb: Sandbox) -> bytes:
    return pb.ListPodSandboxResponse(items=[sandbox_item(sb)]).SerializeToString()


def _status(sb: Sandbox) -> bytes:
    return pb.PodSandboxStatusResponse(status=sandbox_status(sb)).SerializeToString()


class SandboxRPCs:
    """The hot reads answer with bytes encoded once per pod revision (wire.py)."""

    sandboxes: SandboxManager
    containers: ContainerManager
    _pod_container_statuses: ItemCache[Container, bytes]  # ContainerRPCs's
    _sandbox_items: ItemCache[Sandbox, bytes] = ItemCache(_listed)
    _sandbox_statuses: ItemCache[Sandbox, bytes] = ItemCache(_status)

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
    async def PodSandboxStatus(self, request: pb.PodSandboxStatusRequest, context: Ctx) -> bytes:
        sb = self.sandboxes.get(request.pod_sandbox_id)
        info = self.sandboxes.verbose_info(sb) if request.verbose else {}
        # The pod's container statuses as of `timestamp`: what the kubelet's evented PLEG
        # reads instead of a ContainerStatus per container.
        tail = pb.PodSandboxStatusResponse(info=info, timestamp=time.time_ns())
        return b"".join([
            self._sandbox_statuses.get(sb),
            *self._pod_container_statuses.all(self.containers.known_of_sandbox(sb.id)),
            tail.SerializeToString(),
        ])

    @rpc
    async def ListPodSandbox(self, request: pb.ListPodSandboxRequest, context: Ctx) -> bytes:
        flt = request.filter if request.HasField("filter") else None
        return b"".join(self._sandbox_items.all(self.sandboxes.list(flt)))

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
        pb.StreamPodSandboxesResponse, "pod_sandboxes", unary_response=pb.ListPodSandboxResponse,
    )
