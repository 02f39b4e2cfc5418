"""RuntimeService container RPCs: CRI messages in, ContainerManager calls, CRI messages out."""

from __future__ import annotations

import grpc
from google.protobuf import json_format

from pycri.api import api_pb2 as pb
from pycri.checkpoint.manager import CheckpointManager
from pycri.container.manager import ContainerManager
from pycri.container.signals import cri_signal, parse_signal
from pycri.server.errors import rpc
from pycri.server.itemcache import ItemCache
from pycri.server.streamed import streamed_list
from pycri.store.container import Container

Ctx = grpc.aio.ServicerContext


def _image_spec(c: Container) -> pb.ImageSpec:
    return pb.ImageSpec(
        image=c.config.image.image,
        annotations=c.config.image.annotations,
        user_specified_image=c.config.image.user_specified_image or c.config.image.image,
        runtime_handler=c.config.image.runtime_handler,
    )


def _mounts(c: Container) -> list[pb.Mount]:
    """The CRI mounts as requested, with each image volume's image ID in image.image_ref."""
    out = []
    for i, m in enumerate(c.config.mounts):
        if m.image.image and i < len(c.mount_image_ids):
            m = _copy(m)
            m.image.image_ref = c.mount_image_ids[i]
        out.append(m)
    return out


def _copy(m: pb.Mount) -> pb.Mount:
    out = pb.Mount()
    out.CopyFrom(m)
    return out


def container_status(c: Container) -> pb.ContainerStatus:
    resources = json_format.ParseDict(c.resources, pb.LinuxContainerResources())
    return pb.ContainerStatus(
        id=c.id,
        metadata=c.config.metadata,
        state=c.state,  # type: ignore[arg-type]
        created_at=c.created_at,
        started_at=c.started_at,
        finished_at=c.finished_at,
        exit_code=c.exit_code,
        image=_image_spec(c),
        image_ref=c.image_ref,
        image_id=c.image_id,
        reason=c.reason,
        message=c.message,
        labels=c.config.labels,
        annotations=c.config.annotations,
        mounts=_mounts(c),
        log_path=c.log_path,
        resources=pb.ContainerResources(linux=resources),
        user=pb.ContainerUser(
            linux=pb.LinuxContainerUser(uid=c.uid, gid=c.gid, supplemental_groups=c.groups)
        ),
        stop_signal=cri_signal(parse_signal(c.stop_signal)),  # type: ignore[arg-type]
    )


def container_item(c: Container) -> pb.Container:
    return pb.Container(
        id=c.id,
        pod_sandbox_id=c.sandbox_id,
        metadata=c.config.metadata,
        image=_image_spec(c),
        image_ref=c.image_ref,
        image_id=c.image_id,
        state=c.state,  # type: ignore[arg-type]
        created_at=c.created_at,
        labels=c.config.labels,
        annotations=c.config.annotations,
    )


def _listed(c: Container) -> bytes:
    return pb.ListContainersResponse(containers=[container_item(c)]).SerializeToString()


def _status(c: Container) -> bytes:
    return pb.ContainerStatusResponse(status=container_status(c)).SerializeToString()


def _pod_status_part(c: Container) -> bytes:
    return pb.PodSandboxStatusResponse(containers_statuses=[container_status(c)]
                                       ).SerializeToString()


class ContainerRPCs:
    """The hot reads answer with bytes encoded once per container revision (wire.py)."""

    containers: ContainerManager
    checkpoints: CheckpointManager
    _container_items: ItemCache[Container, bytes] = ItemCache(_listed)
    _container_statuses: ItemCache[Container, bytes] = ItemCache(_status)
    # A container's entry in its pod's PodSandboxStatusResponse.containers_statuses.
    _pod_container_statuses: ItemCache[Container, bytes] = ItemCache(_pod_status_part)

    @rpc
    async def CreateContainer(
        self, request: pb.CreateContainerRequest, context: Ctx
    ) -> pb.CreateContainerResponse:
        create = (self.checkpoints.create_container
                  if self.checkpoints.restores(request.config.image.image)
                  else self.containers.create)
        cid = await create(request.pod_sandbox_id, request.config, request.sandbox_config)
        return pb.CreateContainerResponse(container_id=cid)

    @rpc
    async def StartContainer(
        self, request: pb.StartContainerRequest, context: Ctx
    ) -> pb.StartContainerResponse:
        await self.containers.start(request.container_id)
        return pb.StartContainerResponse()

    @rpc
    async def StopContainer(
        self, request: pb.StopContainerRequest, context: Ctx
    ) -> pb.StopContainerResponse:
        await self.containers.stop(request.container_id, int(request.timeout))
        return pb.StopContainerResponse()

    @rpc
    async def RemoveContainer(
        self, request: pb.RemoveContainerRequest, context: Ctx
    ) -> pb.RemoveContainerResponse:
        await self.containers.remove(request.container_id)
        return pb.RemoveContainerResponse()

    @rpc
    async def ContainerStatus(self, request: pb.ContainerStatusRequest, context: Ctx) -> bytes:
        c = self.containers.get(request.container_id)
        status = self._container_statuses.get(c)
        if not request.verbose:
            return status
        info = pb.ContainerStatusResponse(info=self.containers.verbose_info(c))
        return status + info.SerializeToString()

    @rpc
    async def ListContainers(self, request: pb.ListContainersRequest, context: Ctx) -> bytes:
        flt = request.filter if request.HasField("filter") else None
        return b"".join(self._container_items.all(self.containers.list(flt)))

    StreamContainers = streamed_list(
        "StreamContainers", ListContainers, pb.ListContainersRequest, "containers",
        pb.StreamContainersResponse, "containers", unary_response=pb.ListContainersResponse,
    )

    @rpc
    async def UpdateContainerResources(
        self, request: pb.UpdateContainerResourcesRequest, context: Ctx
    ) -> pb.UpdateContainerResourcesResponse:
        await self.containers.update_resources(request.container_id, request.linux)
        return pb.UpdateContainerResourcesResponse()

    @rpc
    async def ReopenContainerLog(
        self, request: pb.ReopenContainerLogRequest, context: Ctx
    ) -> pb.ReopenContainerLogResponse:
        await self.containers.reopen_log(request.container_id)
        return pb.ReopenContainerLogResponse()

    @rpc
    async def ExecSync(self, request: pb.ExecSyncRequest, context: Ctx) -> pb.ExecSyncResponse:
        result = await self.containers.exec_sync(
            request.container_id, list(request.cmd), int(request.timeout)
        )
        return pb.ExecSyncResponse(
            stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code
        )

