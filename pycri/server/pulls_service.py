"""pycri.v1 Pulls: the pulls in flight (image/progress.py) as messages, nothing more."""

from __future__ import annotations

import grpc

from pycri.api import pulls_pb2 as pb
from pycri.api import pulls_pb2_grpc
from pycri.image.manager import ImageManager
from pycri.image.progress import LayerView, PullView
from pycri.server.errors import rpc


def _layer(x: LayerView) -> pb.Layer:
    return pb.Layer(digest=x.digest, size=x.size, fetched=x.fetched, unpacked=x.unpacked,
                    bytes_per_second=x.rate, eta_seconds=-1.0 if x.eta is None else x.eta,
                    endpoint=x.endpoint, done=x.done)


def _pull(p: PullView) -> pb.Pull:
    return pb.Pull(reference=p.reference, phase=p.phase, started_ns=p.started_ns,
                   seconds=p.seconds, clients=p.clients, layers=[_layer(x) for x in p.layers])


class PullsServicer(pulls_pb2_grpc.PullsServicer):
    def __init__(self, manager: ImageManager) -> None:
        self.m = manager

    @rpc
    async def ListPulls(self, request: pb.ListPullsRequest,
                        context: grpc.aio.ServicerContext) -> pb.ListPullsResponse:
        return pb.ListPullsResponse(pulls=[_pull(p) for p in self.m.progress.snapshot()])
