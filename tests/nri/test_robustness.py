"""A plugin cannot hurt the runtime side: garbage, silence and churn, over real sockets.

Each test also checks that the event loop saw no unhandled exception."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from pycri.nri import mux, ttrpc
from pycri.nri.api import api_pb2 as api
from pycri.nri.link import NRIPluginError, PluginLink
from tests.lib.fds import new_fds, open_fds
from tests.lib.nri_plugin import NRIPlugin


class Runtime:
    """Configures each plugin as it registers, counts what it saw."""

    def __init__(self) -> None:
        self.registered = 0

    async def register_plugin(self, link: PluginLink, req: api.RegisterPluginRequest) -> None:
        await link.call("Configure", api.ConfigureRequest(), api.ConfigureResponse, 5)
        self.registered += 1

    async def update_containers(self, link: PluginLink, req: api.UpdateContainersRequest
                                ) -> api.UpdateContainersResponse:
        return api.UpdateContainersResponse()


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Exceptions the loop's handler got (a task that died unobserved, a bad callback)."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    yield seen
    loop.set_exception_handler(None)


async def _link_with_raw_peer() -> tuple[PluginLink, asyncio.StreamReader, asyncio.StreamWriter]:
    a, b = socket.socketpair()
    link = PluginLink(a, Runtime())
    await link.start()
    reader, writer = await asyncio.open_unix_connection(sock=b)
    return link, reader, writer


@pytest.mark.parametrize("seed", range(5))
async def test_random_garbage_closes_the_link_and_nothing_else(
        seed: int, loop_errors: list[dict[str, Any]]) -> None:
    link, _, writer = await _link_with_raw_peer()
    rnd = random.Random(seed)
    try:
        for _ in range(64):
            if link.closed.is_set():
                break
            writer.write(rnd.randbytes(4096))
            await writer.drain()
        await asyncio.wait_for(link.closed.wait(), 5)
        assert "exceeds" in link.reason
        with pytest.raises(NRIPluginError) as e:
            await link.call("Shutdown", api.Empty(), api.Empty, 1)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        writer.close()
        await link.close()
    assert loop_errors == []


async def test_well_framed_garbage_is_answered_and_the_link_stays_usable(
        loop_errors: list[dict[str, Any]]) -> None:
    link, reader, writer = await _link_with_raw_peer()
    try:
        rt = mux.RUNTIME_SERVICE_CONN
        # A request whose ttrpc envelope is not protobuf, one for an unknown method, one
        # whose NRI payload is garbage, a response nobody asked for, and frames for
        # connections nobody opened.
        bad_env = ttrpc.encode(1, ttrpc.TYPE_REQUEST, b"\xff\xff\xff\xff")
        unknown = ttrpc.encode(3, ttrpc.TYPE_REQUEST, ttrpc.RequestMsg(
            service="nri.pkg.api.v1alpha1.Runtime", method="Explode").SerializeToString())
        bad_payload = ttrpc.encode(5, ttrpc.TYPE_REQUEST, ttrpc.RequestMsg(
            service="nri.pkg.api.v1alpha1.Runtime", method="RegisterPlugin",
            payload=b"\x0a\xff").SerializeToString())
        writer.write(mux.frames(rt, bad_env) + mux.frames(rt, unknown)
                     + mux.frames(rt, bad_payload)
                     + mux.frames(mux.PLUGIN_SERVICE_CONN, ttrpc.encode(99, 2, b"junk"))
                     + mux.frames(77, b"whatever") + mux.frames(0, b"reserved"))
        await writer.drain()
        codes = {}
        buf = b""
        while len(codes) < 3:
            buf += await asyncio.wait_for(reader.read(65536), 5)
            while len(buf) >= 8:
                cid, n = struct.unpack_from(">II", buf)
                if len(buf) < 8 + n:
                    break
                assert cid == rt  # answers go back on the connection the requests came on
                for h, body in ttrpc.Decoder().feed(buf[8:8 + n]):
                    resp: Any = ttrpc.ResponseMsg.FromString(body)
                    codes[h.stream_id] = resp.status.code
                buf = buf[8 + n:]
        assert codes == {1: grpc.StatusCode.INVALID_ARGUMENT.value[0],
                         3: grpc.StatusCode.UNIMPLEMENTED.value[0],
                         5: grpc.StatusCode.INVALID_ARGUMENT.value[0]}
        assert not link.closed.is_set()
    finally:
        writer.close()
        await link.close()
    assert loop_errors == []


async def test_a_plugin_that_never_answers_times_out_on_time(
        loop_errors: list[dict[str, Any]]) -> None:
    # The peer reads nothing at all: even a 4 MiB request cannot stall the call
    # past its timeout, and the bytes it will not take do not pile up without bound.
    link, _, writer = await _link_with_raw_peer()
    try:
        big = api.SynchronizeRequest(pods=[api.PodSandbox(id="x" * 4000)] * 1000)
        for request in (api.Empty(), big, big, big):
            start = time.monotonic()
            with pytest.raises(NRIPluginError) as e:
                await link.call("Synchronize", request, api.SynchronizeResponse, 0.3)
            assert time.monotonic() - start < 2
            if e.value.code == grpc.StatusCode.UNAVAILABLE:
                break
            assert e.value.timed_out
        await asyncio.wait_for(link.closed.wait(), 5)
        assert link.reason.startswith("peer is not reading")
    finally:
        writer.close()
        await link.close()
    assert loop_errors == []


async def test_a_hung_handler_in_the_test_plugin_times_out(
        loop_errors: list[dict[str, Any]]) -> None:
    a, b = socket.socketpair()
    link = PluginLink(a, Runtime())
    await link.start()
    plugin = NRIPlugin("hang", "10")
    await plugin.connect(b)
    plugin.delays["CreateContainer"] = 3600
    try:
        with pytest.raises(NRIPluginError) as e:
            await link.call("CreateContainer", api.CreateContainerRequest(),
                            api.CreateContainerResponse, 0.2)
        assert e.value.timed_out and e.value.plugin == "hang"
        # Other calls are not wedged behind the hung one.
        await link.call("StartContainer", api.StartContainerRequest(),
                        api.StartContainerResponse, 5)
    finally:
        await plugin.close()
        await link.close()
    assert loop_errors == []


async def test_connect_disconnect_200_times_leaks_no_fd_and_no_task(
        tmp_path: Path, loop_errors: list[dict[str, Any]]) -> None:
    path = str(tmp_path / "nri.sock")
    rt = Runtime()
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(64)
    lsock.setblocking(False)
    loop = asyncio.get_running_loop()
    links: set[PluginLink] = set()

    async def serve_one(conn: socket.socket) -> None:
        link = PluginLink(conn, rt)
        links.add(link)
        await link.start()
        await link.closed.wait()
        await link.close()
        links.discard(link)

    serving: set[asyncio.Task[None]] = set()

    async def accept() -> None:
        while True:
            conn, _ = await loop.sock_accept(lsock)
            t = loop.create_task(serve_one(conn))
            serving.add(t)
            t.add_done_callback(serving.discard)

    acceptor = loop.create_task(accept())
    await asyncio.sleep(0)
    fds = open_fds()
    tasks = len(asyncio.all_tasks())
    try:
        for i in range(200):
            kind = i % 4
            if kind == 0:  # a full plugin: register, configure, leave
                plugin = NRIPlugin("churn", "20")
                await plugin.connect(path)
                await plugin.close()
                continue
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            await loop.sock_connect(sock, path)
            if kind == 2:  # half a frame, then gone
                await loop.sock_sendall(sock, struct.pack(">II", 2, 100) + b"abc")
            elif kind == 3:  # a request it will never wait for
                await loop.sock_sendall(sock, mux.frames(mux.RUNTIME_SERVICE_CONN, ttrpc.encode(
                    1, 1, ttrpc.RequestMsg(service="x", method="y").SerializeToString())))
            sock.close()
        for _ in range(200):
            if not links and not serving:
                break
            await asyncio.sleep(0.02)
        assert not links and not serving
        assert rt.registered == 50
        assert new_fds(fds) == set()
        assert len(asyncio.all_tasks()) == tasks
    finally:
        acceptor.cancel()
        await asyncio.gather(acceptor, return_exceptions=True)
        lsock.close()
    assert loop_errors == []
