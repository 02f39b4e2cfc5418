"""ttrpc framing and the client/server channel, over real unix sockets."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc
import pytest

from pycri.nri import ttrpc
from pycri.nri.ttrpc import Channel, Decoder, ProtocolError, TTRPCError


def test_header_is_big_endian_length_stream_type_flags() -> None:
    assert ttrpc.encode(3, ttrpc.TYPE_REQUEST, b"ab") == \
        b"\x00\x00\x00\x02" b"\x00\x00\x00\x03" b"\x01" b"\x00" b"ab"
    assert ttrpc.encode(0x01020304, ttrpc.TYPE_RESPONSE, b"", flags=0x5)[4:] == \
        b"\x01\x02\x03\x04\x02\x05"


def test_envelope_field_numbers_match_ttrpc_request_proto() -> None:
    req = ttrpc.RequestMsg(service="s", method="m", payload=b"p", timeout_nano=5)
    req.metadata.add(key="k", value="v")  # type: ignore[attr-defined]
    assert req.SerializeToString() == b"\n\x01s\x12\x01m\x1a\x01p\x20\x05\x2a\x06\n\x01k\x12\x01v"
    # Response{status: Status{code: 5, message: "x"}, payload: "q"}
    assert ttrpc.status_response(grpc.StatusCode.NOT_FOUND, "x") == b"\n\x05\x08\x05\x12\x01x"
    assert ttrpc.ResponseMsg(payload=b"q").SerializeToString() == b"\x12\x01q"


def test_decoder_reassembles_any_split() -> None:
    stream = (ttrpc.encode(1, 1, b"hello") + ttrpc.encode(3, 2, b"")
              + ttrpc.encode(5, 1, b"x" * 70000))
    for step in (1, 7, 4096, len(stream)):
        d = Decoder()
        got = []
        for i in range(0, len(stream), step):
            got += d.feed(stream[i:i + step])
        assert [(h.stream_id, h.type, len(b)) for h, b in got] == \
            [(1, 1, 5), (3, 2, 0), (5, 1, 70000)]


def test_decoder_refuses_a_frame_over_4mib_before_buffering_it() -> None:
    # Exactly 4 MiB is allowed: the decoder waits for the data.
    assert list(Decoder().feed(struct.pack(">IIBB", ttrpc.MAX_MESSAGE, 1, 1, 0))) == []
    with pytest.raises(ProtocolError, match="exceeds the 4194304-byte limit"):
        list(Decoder().feed(struct.pack(">IIBB", ttrpc.MAX_MESSAGE + 1, 1, 1, 0)))
    with pytest.raises(ValueError):
        ttrpc.encode(1, 1, b"\0" * (ttrpc.MAX_MESSAGE + 1))


@dataclass
class End:
    """One end of a socketpair running a Channel fed by a reader task."""

    channel: Channel
    writer: asyncio.StreamWriter
    reader_task: asyncio.Task[None]
    errors: list[str]


async def _end(sock: socket.socket, handler: ttrpc.Handler | None) -> End:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    errors: list[str] = []

    async def send(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    ch = Channel(send, handler, on_error=errors.append)

    async def pump() -> None:
        while data := await reader.read(65536):
            ch.feed(data)
        ch.close("peer closed")
    return End(ch, writer, asyncio.get_running_loop().create_task(pump()), errors)


Pair = Callable[[ttrpc.Handler | None], Awaitable[tuple[End, End]]]


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    ends: list[End] = []

    async def make(server_handler: ttrpc.Handler | None) -> tuple[End, End]:
        a, b = socket.socketpair()
        client, server = await _end(a, None), await _end(b, server_handler)
        ends.extend((client, server))
        return client, server
    yield make
    for e in ends:
        e.channel.close()
        e.writer.close()
        e.reader_task.cancel()
        await asyncio.gather(e.reader_task, return_exceptions=True)
        await e.channel.wait_closed()


async def echo(service: str, method: str, payload: bytes) -> bytes:
    if method == "Sleep":
        await asyncio.sleep(float(payload))
        return payload
    if method == "Fail":
        raise TTRPCError(grpc.StatusCode.NOT_FOUND, "no such thing")
    if method == "Bug":
        raise RuntimeError("handler bug")
    if method == "Big":
        return b"\0" * (ttrpc.MAX_MESSAGE + 1)
    return f"{service}/{method}:".encode() + payload


async def test_call_roundtrip_and_status_codes(pair: Pair) -> None:
    client, _ = await pair(echo)
    assert await client.channel.call("svc", "Echo", b"hi", 5) == b"svc/Echo:hi"
    big = b"z" * (3 << 20)
    assert await client.channel.call("svc", "Echo", big, 5) == b"svc/Echo:" + big
    with pytest.raises(TTRPCError) as e:
        await client.channel.call("svc", "Fail", b"", 5)
    assert e.value.code == grpc.StatusCode.NOT_FOUND and e.value.message == "no such thing"
    with pytest.raises(TTRPCError) as e:
        await client.channel.call("svc", "Bug", b"", 5)
    assert e.value.code == grpc.StatusCode.UNKNOWN and "handler bug" in e.value.message
    with pytest.raises(TTRPCError) as e:
        await client.channel.call("svc", "Big", b"", 5)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_no_handler_is_unimplemented(pair: Pair) -> None:
    client, _ = await pair(None)
    with pytest.raises(TTRPCError) as e:
        await client.channel.call("svc", "Echo", b"", 5)
    assert e.value.code == grpc.StatusCode.UNIMPLEMENTED


async def test_concurrent_calls_answered_out_of_order(pair: Pair) -> None:
    client, _ = await pair(echo)
    slow = asyncio.ensure_future(client.channel.call("s", "Sleep", b"0.3", 5))
    fast = asyncio.ensure_future(client.channel.call("s", "Sleep", b"0.01", 5))
    done, _ = await asyncio.wait({slow, fast}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {fast}
    assert await slow == b"0.3"


async def test_timeout_is_deadline_exceeded_and_a_late_answer_is_dropped(pair: Pair) -> None:
    client, server = await pair(echo)
    with pytest.raises(TTRPCError) as e:
        await client.channel.call("s", "Sleep", b"0.3", 0.05)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    # The server saw timeout_nano and gave up too; the channel stays usable.
    await asyncio.sleep(0.4)
    assert await client.channel.call("s", "Echo", b"again", 5) == b"s/Echo:again"
    assert client.errors == [] and server.errors == []


async def test_peer_gone_fails_pending_calls_unavailable(pair: Pair) -> None:
    client, server = await pair(echo)
    call = asyncio.ensure_future(client.channel.call("s", "Sleep", b"30", 60))
    await asyncio.sleep(0.05)
    server.writer.close()
    with pytest.raises(TTRPCError) as e:
        await asyncio.wait_for(call, 5)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(TTRPCError) as e:
        await client.channel.call("s", "Echo", b"", 5)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


async def _raw_exchange(server: End, raw_writer: asyncio.StreamWriter,
                        raw_reader: asyncio.StreamReader, frame: bytes) -> tuple[int, bytes]:
    raw_writer.write(frame)
    await raw_writer.drain()
    head = await asyncio.wait_for(raw_reader.readexactly(10), 5)
    length, sid, mtype, _ = struct.unpack(">IIBB", head)
    assert mtype == ttrpc.TYPE_RESPONSE
    return sid, await raw_reader.readexactly(length)


async def test_server_enforces_stream_id_rules_and_unary_only() -> None:
    a, b = socket.socketpair()
    server = await _end(b, echo)
    reader, writer = await asyncio.open_unix_connection(sock=a)
    try:
        req = ttrpc.RequestMsg(service="s", method="Echo", payload=b"x").SerializeToString()

        async def status_of(sid: int, mtype: int = 1, flags: int = 0, body: bytes = req
                            ) -> tuple[int, str]:
            got_sid, data = await _raw_exchange(server, writer, reader,
                                                ttrpc.encode(sid, mtype, body, flags))
            assert got_sid == sid
            st = ttrpc.ResponseMsg.FromString(data).status  # type: ignore[attr-defined]
            return st.code, st.message

        assert await status_of(2) == (3, "StreamID must be odd for client initiated streams")
        assert (await status_of(5))[0] == 0
        assert await status_of(3) == (3, "StreamID cannot be re-used and must increment")
        assert (await status_of(7, flags=ttrpc.FLAG_REMOTE_OPEN))[0] == \
            grpc.StatusCode.UNIMPLEMENTED.value[0]
        assert (await status_of(9, mtype=ttrpc.TYPE_DATA))[0] == 3
        code, msg = await status_of(11, body=b"\xff\xff\xff")
        assert code == 3 and "unmarshal request error" in msg
        assert server.errors == []
    finally:
        writer.close()
        server.writer.close()
        server.reader_task.cancel()
        await asyncio.gather(server.reader_task, return_exceptions=True)


async def test_oversized_frame_closes_with_a_clear_reason(caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    a, b = socket.socketpair()
    server = await _end(b, echo)
    _, writer = await asyncio.open_unix_connection(sock=a)
    try:
        writer.write(struct.pack(">IIBB", 5 << 20, 1, 1, 0))
        await writer.drain()
        for _ in range(100):
            if server.errors:
                break
            await asyncio.sleep(0.02)
        assert server.errors == ["ttrpc message of 5242880 bytes exceeds the 4194304-byte limit"]
        assert server.channel.closed
        assert "closing connection: ttrpc message of 5242880 bytes" in caplog.text
    finally:
        writer.close()
        server.writer.close()
        server.reader_task.cancel()
        await asyncio.gather(server.reader_task, return_exceptions=True)


async def test_a_peer_flooding_requests_is_dropped(pair: Pair) -> None:
    client, server = await pair(echo)
    calls = [asyncio.ensure_future(client.channel.call("s", "Sleep", b"0.5", 10))
             for _ in range(ttrpc.MAX_INFLIGHT)]
    assert await asyncio.gather(*calls) == [b"0.5"] * ttrpc.MAX_INFLIGHT  # at the limit: fine
    # One more than the limit in a single burst: the connection is dropped, every call
    # fails, and the burst's tail is never even decoded.
    burst = b"".join(ttrpc.encode(1001 + 2 * i, ttrpc.TYPE_REQUEST, ttrpc.RequestMsg(
        service="s", method="Sleep", payload=b"5").SerializeToString())
        for i in range(ttrpc.MAX_INFLIGHT + 1000))
    client.writer.write(burst)
    await client.writer.drain()
    for _ in range(100):
        if server.errors:
            break
        await asyncio.sleep(0.02)
    assert server.errors == [f"peer has more than {ttrpc.MAX_INFLIGHT} requests in flight"]
    await server.channel.wait_closed()  # the 64 served requests were cancelled
