"""The NRI multiplexer: frames, demultiplexing, and the two-channel Wire, over real sockets."""

from __future__ import annotations

import asyncio
import errno
import socket
import struct
from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from pycri.nri import mux, ttrpc
from pycri.nri.mux import Mux, Wire


def _split(stream: bytes) -> list[tuple[int, bytes]]:
    out = []
    while stream:
        cid, n = struct.unpack_from(">II", stream)
        out.append((cid, stream[8:8 + n]))
        stream = stream[8 + n:]
    return out


class GoReader:
    """How the Go side reads a mux connection: ttrpc's 4 KiB bufio.Reader over a
    conn whose Read hands over exactly one frame and fails (ENOMEM) when the frame
    is larger than the slice it was given."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames
        self.buf = b""

    def _read(self, n: int) -> bytes:
        if not self.buf:
            frame = self.frames.pop(0)
            space = n if n >= mux.GO_READ_BUFFER else mux.GO_READ_BUFFER
            if len(frame) > space:
                raise OSError(errno.ENOMEM, "frame larger than the read buffer")
            if n >= mux.GO_READ_BUFFER:
                return frame
            self.buf = frame
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_full(self, n: int) -> bytes:
        got = b""
        while len(got) < n:
            got += self._read(n - len(got))
        return got

    def message(self) -> bytes:
        length = struct.unpack(">I", self.read_full(10)[:4])[0]
        return self.read_full(length)


@pytest.mark.parametrize("size", [0, 1, 4086, 4087, 5000, 8192, 100_000, ttrpc.MAX_MESSAGE])
def test_frames_fit_a_go_peers_reads(size: int) -> None:
    bodies = [bytes([i % 251]) * size for i in range(3)]
    stream = b"".join(mux.frames(2, ttrpc.encode(1, 1, b)) for b in bodies)
    parts = _split(stream)
    assert {cid for cid, _ in parts} == {2}
    assert all(len(p) <= mux.MAX_PAYLOAD for _, p in parts)
    reader = GoReader([p for _, p in parts])
    assert [reader.message() for _ in bodies] == bodies
    assert reader.frames == []


def test_go_reader_model_rejects_one_big_frame() -> None:
    # The reason frames() cuts at 4096: a single 5000-byte frame breaks a Go peer.
    with pytest.raises(OSError):
        GoReader([ttrpc.encode(1, 1, b"x" * 5000)]).message()


@pytest.fixture
async def trunk() -> AsyncIterator[tuple[socket.socket, asyncio.StreamReader,
                                         asyncio.StreamWriter]]:
    a, b = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=b)
    yield a, reader, writer
    writer.close()
    a.close()


async def test_demultiplexes_by_connection_and_drops_unopened(trunk: tuple[
        socket.socket, asyncio.StreamReader, asyncio.StreamWriter]) -> None:
    sock, peer_reader, peer = trunk
    m = Mux(sock)
    got: dict[int, bytes] = {1: b"", 2: b""}
    closes: list[str] = []

    def sink(cid: int) -> Callable[[bytes], None]:
        def on(data: bytes) -> None:
            got[cid] += data
        return on
    send1 = m.open(1, sink(1), closes.append)
    m.open(2, sink(2), closes.append)
    with pytest.raises(ValueError):
        m.open(0, sink(0), closes.append)
    await m.start()
    peer.write(b"".join(struct.pack(">II", cid, len(d)) + d for cid, d in
                        [(1, b"ab"), (2, b"xy"), (7, b"lost"), (1, b"cd"), (2, b"")]))
    await peer.drain()
    await send1(b"to-peer")
    assert await asyncio.wait_for(peer_reader.readexactly(8 + 7), 5) == \
        struct.pack(">II", 1, 7) + b"to-peer"
    for _ in range(100):
        if got == {1: b"abcd", 2: b"xy"}:
            break
        await asyncio.sleep(0.01)
    assert got == {1: b"abcd", 2: b"xy"}
    peer.close()
    await asyncio.wait_for(m.closed.wait(), 5)
    assert closes == ["peer closed the connection"] * 2
    await m.close()
    with pytest.raises(ConnectionResetError):
        await send1(b"late")


async def test_oversized_mux_frame_closes_with_a_clear_log(
        trunk: tuple[socket.socket, asyncio.StreamReader, asyncio.StreamWriter],
        caplog: pytest.LogCaptureFixture) -> None:
    sock, peer_reader, peer = trunk
    m = Mux(sock, name="t")
    closes: list[str] = []
    m.open(1, lambda d: None, closes.append)
    await m.start()
    peer.write(struct.pack(">II", 1, mux.MAX_PAYLOAD + 1))
    await peer.drain()
    await asyncio.wait_for(m.closed.wait(), 5)
    assert "exceeds the 4194314-byte limit" in closes[0]
    assert "t: closing connection: mux frame of 4194315 bytes" in caplog.text
    assert await asyncio.wait_for(peer_reader.read(), 5) == b""  # the trunk is closed
    await m.close()


async def test_wire_calls_both_ways_at_once() -> None:
    a, b = socket.socketpair()

    def handler(tag: str) -> ttrpc.Handler:
        async def h(service: str, method: str, payload: bytes) -> bytes:
            await asyncio.sleep(0.05)
            return f"{tag}:{service}/{method}:".encode() + payload
        return h
    runtime = Wire(a, call_conn=mux.PLUGIN_SERVICE_CONN, serve_conn=mux.RUNTIME_SERVICE_CONN,
                   handler=handler("runtime"))
    plugin = Wire(b, call_conn=mux.RUNTIME_SERVICE_CONN, serve_conn=mux.PLUGIN_SERVICE_CONN,
                  handler=handler("plugin"))
    await runtime.start()
    await plugin.start()
    try:
        r = [runtime.call("P", f"m{i}", b"r", 5) for i in range(10)]
        p = [plugin.call("R", f"m{i}", b"p", 5) for i in range(10)]
        out = await asyncio.gather(*r, *p)
        assert out[:10] == [f"plugin:P/m{i}:r".encode() for i in range(10)]
        assert out[10:] == [f"runtime:R/m{i}:p".encode() for i in range(10)]
        # A framing violation on one channel drops the whole trunk.
        plugin.mux._writer.write(mux.frames(mux.RUNTIME_SERVICE_CONN,  # type: ignore[union-attr]
                                            struct.pack(">IIBB", 5 << 20, 1, 1, 0)))
        await asyncio.wait_for(runtime.closed.wait(), 5)
        assert "exceeds the 4194304-byte limit" in runtime.reason
        await asyncio.wait_for(plugin.closed.wait(), 5)
        with pytest.raises(ttrpc.TTRPCError) as e:
            await plugin.call("R", "m", b"", 5)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        await runtime.close()
        await plugin.close()
