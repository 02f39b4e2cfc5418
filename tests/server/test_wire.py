"""server/wire.py: handlers may answer with encoded bytes, and answers assembled by
concatenating encoded parts are the messages built whole."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc as pb_grpc
from pycri.server import wire


class Servicer(pb_grpc.RuntimeServiceServicer):
    async def Version(self, request: pb.VersionRequest, context: object) -> bytes:
        return pb.VersionResponse(runtime_name="encoded").SerializeToString()

    async def Status(self, request: pb.StatusRequest, context: object) -> pb.StatusResponse:
        return pb.StatusResponse(info={"built": "whole"})


async def test_bytes_and_messages_both_reach_the_client(tmp_path: Path) -> None:
    path = f"unix:{tmp_path}/s.sock"
    server = grpc.aio.server()
    wire.register(pb_grpc.add_RuntimeServiceServicer_to_server, Servicer(), server)
    server.add_insecure_port(path)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(path) as ch:
            stub = pb_grpc.RuntimeServiceStub(ch)
            v = await stub.Version(pb.VersionRequest())
            s = await stub.Status(pb.StatusRequest())
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.ListContainers(pb.ListContainersRequest())
    finally:
        await server.stop(None)
    assert v.runtime_name == "encoded"
    assert s.info["built"] == "whole"
    # The rest of the table is registered still (the servicer base's answer).
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_concatenated_parts_are_the_whole_message() -> None:
    status = pb.PodSandboxStatus(id="p", state=pb.SANDBOX_READY, labels={"a": "b"})
    ctrs = [pb.ContainerStatus(id=f"c{i}", state=pb.CONTAINER_RUNNING) for i in range(3)]
    whole = pb.PodSandboxStatusResponse(status=status, containers_statuses=ctrs,
                                        info={"info": "{}"}, timestamp=7)
    parts = [pb.PodSandboxStatusResponse(status=status).SerializeToString(),
             *(pb.PodSandboxStatusResponse(containers_statuses=[c]).SerializeToString()
               for c in ctrs),
             pb.PodSandboxStatusResponse(info={"info": "{}"}, timestamp=7).SerializeToString()]
    assert pb.PodSandboxStatusResponse.FromString(b"".join(parts)) == whole
