"""RuntimeService checkpoint RPCs: CRI messages in, CheckpointManager calls, CRI messages out."""

from __future__ import annotations

import grpc

from pycri.api import api_pb2 as pb
from pycri.checkpoint.manager import CheckpointManager
from pycri.server.errors import rpc

Ctx = grpc.aio.ServicerContext


class CheckpointRPCs:
    checkpoints: CheckpointManager

    @rpc
    async def CheckpointContainer(
        self, request: pb.CheckpointContainerRequest, context: Ctx
    ) -> pb.CheckpointContainerResponse:
        await self.checkpoints.checkpoint_container(
            request.container_id, request.location, int(request.timeout)
        )
        return pb.CheckpointContainerResponse()

    @rpc
    async def CheckpointPod(
        self, request: pb.CheckpointPodRequest, context: Ctx
    ) -> pb.CheckpointPodResponse:
        await self.checkpoints.checkpoint_pod(
            request.pod_sandbox_id, request.output_path, list(request.container_ids)
        )
        return pb.CheckpointPodResponse()

    @rpc
    async def RestorePod(
        self, request: pb.RestorePodRequest, context: Ctx
    ) -> pb.RestorePodResponse:
        sid, restored = await self.checkpoints.restore_pod(
            request.checkpoint_path, request.config, request.runtime_handler,
            list(request.container_configs))
        return pb.RestorePodResponse(pod_sandbox_id=sid, restored_containers=[
            pb.RestoredContainer(name=name, container_id=cid) for name, cid in restored])
