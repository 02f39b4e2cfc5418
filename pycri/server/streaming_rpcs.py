"""Exec, Attach, PortForward: validate through the streaming server, answer with a URL."""

from __future__ import annotations

import grpc

from pycri.api import api_pb2 as pb
from pycri.server.errors import rpc
from pycri.streaming import AttachRequest, ExecRequest, PortForwardRequest, StreamingServer

Ctx = grpc.aio.ServicerContext


class StreamingRPCs:
    streaming: StreamingServer

    @rpc
    async def Exec(self, request: pb.ExecRequest, context: Ctx) -> pb.ExecResponse:
        req = ExecRequest(
            container_id=request.container_id,
            cmd=list(request.cmd),
            tty=request.tty,
            stdin=request.stdin,
            stdout=request.stdout,
            stderr=request.stderr,
        )
        return pb.ExecResponse(url=self.streaming.exec_url(req))

    @rpc
    async def Attach(self, request: pb.AttachRequest, context: Ctx) -> pb.AttachResponse:
        req = AttachRequest(
            container_id=request.container_id,
            tty=request.tty,
            stdin=request.stdin,
            stdout=request.stdout,
            stderr=request.stderr,
        )
        return pb.AttachResponse(url=self.streaming.attach_url(req))

    @rpc
    async def PortForward(
        self, request: pb.PortForwardRequest, context: Ctx
    ) -> pb.PortForwardResponse:
        req = PortForwardRequest(sandbox_id=request.pod_sandbox_id, ports=list(request.port))
        return pb.PortForwardResponse(url=self.streaming.port_forward_url(req))
