"""SPDY/3.1 framing and header codec, and the protocol helpers, byte for byte."""

from __future__ import annotations

import asyncio
import json
import struct
import zlib
from collections.abc import AsyncIterator

import pytest

from pycri.streaming import http, inbox, remotecommand, spdy
from pycri.streaming import session as session_mod
from pycri.streaming.session import Session

FRAMES: list[spdy.Frame] = [
    spdy.DataFrame(1, b"hello", fin=False),
    spdy.DataFrame(3, b"", fin=True),
    spdy.SynStream(5, {"streamtype": ["stdout"], "x": ["a", "b"]}, associated_id=1,
                   priority=3, fin=True),
    spdy.SynReply(5, {}),
    spdy.HeadersFrame(7, {"k": ["v"]}, fin=True),
    spdy.RstStream(9, spdy.PROTOCOL_ERROR),
    spdy.Settings([(0, 7, 65536), (1, 4, 100)], clear=True),
    spdy.Ping(2),
    spdy.GoAway(11, 0),
    spdy.WindowUpdate(13, 1 << 20),
]


def test_dictionary_is_the_spdy3_one() -> None:
    # Its zlib id (adler32) is what a SPDY/3 peer announces in the first header block.
    assert len(spdy.DICTIONARY) == 1423
    assert zlib.adler32(spdy.DICTIONARY) == 0xE3C6A7C2
    assert spdy.DICTIONARY.startswith(b"\0\0\0\x07options\0\0\0\x04head")
    assert spdy.DICTIONARY.endswith(b",*,enq=0.")


def test_every_frame_round_trips_and_parses_byte_by_byte() -> None:
    sender, receiver = spdy.Codec(), spdy.Codec()
    wire = b"".join(sender.encode(f) for f in FRAMES)
    got: list[spdy.Frame] = []
    for i in range(len(wire)):
        got += receiver.feed(wire[i : i + 1])
    assert got == FRAMES


def test_wire_layout() -> None:
    codec = spdy.Codec()
    assert codec.encode(spdy.DataFrame(5, b"ab", fin=True)) == b"\0\0\0\x05\x01\0\0\x02ab"
    assert codec.encode(spdy.Ping(7)) == b"\x80\x03\0\x06\0\0\0\x04\0\0\0\x07"
    assert codec.encode(spdy.RstStream(3, 5)) == b"\x80\x03\0\x03\0\0\0\x08\0\0\0\x03\0\0\0\x05"
    syn = codec.encode(spdy.SynStream(1, {"a": ["b"]}))
    assert syn[:4] == b"\x80\x03\0\x01" and struct.unpack(">I", syn[4:8])[0] == len(syn) - 8
    # The first header block is a zlib stream that names the SPDY dictionary.
    block = syn[18:]
    assert block[1] & 0x20 and struct.unpack(">I", block[2:6])[0] == 0xE3C6A7C2
    raw = zlib.decompressobj(zdict=spdy.DICTIONARY).decompress(block)
    assert raw == b"\0\0\0\x01\0\0\0\x01a\0\0\0\x01b"


def test_header_contexts_persist_across_frames() -> None:
    """Later blocks depend on earlier ones: a fresh decoder cannot read the second one."""
    sender = spdy.Codec()
    first = sender.encode(spdy.SynReply(1, {"streamtype": ["error"]}))
    second = sender.encode(spdy.SynReply(3, {"streamtype": ["error"]}))
    receiver = spdy.Codec()
    assert receiver.feed(first + second)[1] == spdy.SynReply(3, {"streamtype": ["error"]})
    with pytest.raises(spdy.SpdyError):
        spdy.Codec().feed(second)


def test_names_lowercased_values_nul_joined() -> None:
    raw = spdy.encode_header_block({"StreamType": ["a", "b"]})
    assert raw == b"\0\0\0\x01\0\0\0\x0astreamtype\0\0\0\x03a\0b"
    assert spdy.decode_header_block(raw) == {"streamtype": ["a", "b"]}


@pytest.mark.parametrize("raw", [
    b"\0\0\0\x01\0\0\0\x05ab",  # truncated name
    b"\0\0\0\0extra",  # trailing bytes
    b"\0\0\0\x02\0\0\0\x01a\0\0\0\0\0\0\0\x01a\0\0\0\0",  # duplicate name
])  # fmt: skip
def test_bad_header_blocks(raw: bytes) -> None:
    with pytest.raises(spdy.SpdyError):
        spdy.decode_header_block(raw)


def test_unsupported_version_and_unknown_types() -> None:
    with pytest.raises(spdy.SpdyError, match="version 2"):
        spdy.Codec().feed(b"\x80\x02\0\x06\0\0\0\x04\0\0\0\x01")
    # An unknown control type is parsed as such (sessions ignore it), the next frame still
    # parsed.
    assert spdy.Codec().feed(b"\x80\x03\0\x63\0\0\0\x01x" + b"\0\0\0\x01\0\0\0\0") == [
        spdy.Unknown(0x63), spdy.DataFrame(1, b"")]


def test_terminal_sizes_parse_incrementally() -> None:
    buf = bytearray(b'{"Width":80,"Height":24}\n{"Width":1')
    assert remotecommand.parse_sizes(buf) == [remotecommand.TerminalSize(80, 24)]
    assert buf == b'{"Width":1'
    buf += b'00,"Height":30}{"Width":0,"Height":5}'
    assert remotecommand.parse_sizes(buf) == [remotecommand.TerminalSize(100, 30)]
    assert buf == b""


def test_status_bodies() -> None:
    v4 = remotecommand.V4
    assert json.loads(remotecommand.status_body(v4, 0, None)) == {
        "metadata": {}, "status": "Success"}
    failed = json.loads(remotecommand.status_body(v4, 42, None))
    assert failed["reason"] == "NonZeroExitCode"
    assert failed["details"]["causes"] == [{"reason": "ExitCode", "message": "42"}]
    err = json.loads(remotecommand.status_body(v4, None, "boom"))
    assert (err["status"], err["message"]) == ("Failure", "boom")
    assert remotecommand.status_body(remotecommand.V2, 0, None) == b""
    assert remotecommand.status_body(remotecommand.V3, None, "boom") == b"boom"


def test_negotiation() -> None:
    assert http.negotiate([], ["a"]) == ""
    assert http.negotiate(["x", "b", "a"], ["a", "b"]) == "b"
    assert http.negotiate(["x"], ["a"]) is None


async def test_request_head_parsing() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"POST /exec/tok?x=1 HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                     b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n"
                     b"X-Stream-Protocol-Version: v3.channel.k8s.io, v2.channel.k8s.io\r\n\r\n")
    req = await http.read_request(reader)
    assert (req.method, req.path, req.upgrade()) == ("POST", "/exec/tok", "spdy/3.1")
    assert req.values(http.PROTOCOL_HEADER) == [
        "v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io"]
    bad = asyncio.StreamReader()
    bad.feed_data(b"garbage\r\n\r\n")
    with pytest.raises(http.BadRequest):
        await http.read_request(bad)


@pytest.fixture
async def sessions() -> AsyncIterator[tuple[Session, Session]]:
    """A client and a server session over a real loopback TCP connection."""
    accepted: asyncio.Queue[Session] = asyncio.Queue()

    async def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        s = Session(r, w, server=True)
        s.start()
        await accepted.put(s)
        await s.closed.wait()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    r, w = await asyncio.open_connection("127.0.0.1", port)
    client = Session(r, w, server=False)
    client.start()
    srv = await accepted.get()
    yield client, srv
    await srv.close(linger=1)  # first: a client blocked on a full socket then gets an error
    await client.close(linger=1)
    server.close()


async def test_sessions_talk_to_each_other(sessions: tuple[Session, Session]) -> None:
    """Client and server sessions over a socket pair: open, data both ways, FIN, ping."""
    client, srv = sessions
    stream = await client.open({"streamtype": ["stdin"]})
    incoming = await srv.accept()
    assert incoming is not None and incoming.header("StreamType") == "stdin"
    await stream.write(b"x" * 100_000)
    await stream.close()
    assert await incoming.read_all() == b"x" * 100_000
    await incoming.write(b"back")
    await incoming.close()
    assert await stream.read_all() == b"back"
    await client.ping()
    await srv.ping()


def test_oversized_frames_and_header_bombs_are_refused() -> None:
    # A DATA frame longer than we accept: refused from its header, before the body arrives.
    head = struct.pack(">I", 1) + bytes([0]) + (spdy.MAX_RECEIVE + 1).to_bytes(3, "big")
    with pytest.raises(spdy.SpdyError, match="limit"):
        spdy.Codec().feed(head)
    # A small SYN_STREAM whose header block inflates to 8 MiB.
    bomb = zlib.compressobj(zdict=spdy.DICTIONARY)
    block = bomb.compress(struct.pack(">I", 1) + struct.pack(">I", 1) + b"a"
                          + struct.pack(">I", 8 << 20) + b"b" * (8 << 20))
    block += bomb.flush(zlib.Z_SYNC_FLUSH)
    body = struct.pack(">IIH", 1, 0, 0) + block
    frame = struct.pack(">HHI", 0x8003, spdy.SYN_STREAM, len(body)) + body
    with pytest.raises(spdy.SpdyError, match="inflates past"):
        spdy.Codec().feed(frame)


def test_resize_garbage_is_ignored_not_fatal() -> None:
    buf = bytearray(b'{"Width":"a","Height":1}{"Width":1e999,"Height":2}{"Width":90,"Height":9}')
    assert remotecommand.parse_sizes(buf) == [remotecommand.TerminalSize(90, 9)]


async def test_a_slow_reader_pushes_back_instead_of_buffering(
    sessions: tuple[Session, Session],
) -> None:
    client, srv = sessions
    stream = await client.open({"streamtype": ["stdin"]})
    incoming = await srv.accept()
    assert incoming is not None
    sender = asyncio.create_task(stream.write(b"y" * (64 << 20)))  # 64 MiB, nobody reading
    await asyncio.sleep(1.0)
    assert len(incoming.input) <= inbox.MAX_STREAM_BUFFER + 32 * 1024
    assert not sender.done()  # the sender is held back by TCP, not buffered by us
    total = 0
    while total < 64 << 20:
        total += len(await incoming.read())
    await sender


async def test_streams_never_accepted_count_and_a_flood_closes_the_session(
    sessions: tuple[Session, Session],
) -> None:
    # Opened already finished both ways (FIN|UNIDIRECTIONAL) and never accepted: each still
    # counts until the application takes it, and a peer that keeps opening refused streams
    # has the session closed instead of piling them up.
    client, srv = sessions
    limit = session_mod.MAX_STREAMS
    for k in range(3 * limit):
        await client.send(spdy.SynStream(1 + 2 * k, {"streamtype": [f"x{k}"]}, fin=True,
                                         unidirectional=True))  # fmt: skip
        if srv.closed.is_set():
            break
    await asyncio.wait_for(srv.closed.wait(), 10)
    assert srv.abuse is not None and "refused" in srv.abuse
    assert len(srv.streams) <= limit and srv.incoming.qsize() <= limit + 1


async def test_many_streams_share_one_buffer_bound(sessions: tuple[Session, Session]) -> None:
    # Frames of 1 MiB, fewer per stream than any per-stream frame count would stop, on
    # many streams: the session as a whole holds at most its bound.
    client, srv = sessions
    srv.pool.limit = 4 << 20
    opened = [await client.open({"streamtype": [f"s{i}"]}) for i in range(10)]
    frame = b"q" * spdy.MAX_RECEIVE

    async def flood() -> None:
        for _ in range(3):
            for s in opened:
                await client.send(spdy.DataFrame(s.id, frame))

    sender = asyncio.create_task(flood())
    await asyncio.sleep(1.5)  # nobody reads on the server side yet
    held = sum(len(s.input) for s in srv.streams.values())
    assert held <= srv.pool.limit + spdy.MAX_RECEIVE, f"{held >> 20} MiB buffered"
    assert held == srv.pool.used
    accepted = [await srv.accept() for _ in opened]

    async def read(stream: session_mod.Stream | None, size: int) -> int:
        assert stream is not None
        total = 0
        while total < size:
            total += len(await stream.read())
        return total

    # Nothing was dropped: everything arrives once the streams are read.
    assert await asyncio.gather(*(read(s, 3 * len(frame)) for s in accepted)) == [
        3 * len(frame)] * 10
    await sender


async def test_a_burst_the_application_keeps_up_with_is_not_abuse(
    sessions: tuple[Session, Session],
) -> None:
    # 400 streams arriving in one read (as many port-forward connections opened at once):
    # the session waits for the application to take them instead of refusing them.
    client, srv = sessions
    got: list[session_mod.Stream] = []

    async def take() -> None:
        while len(got) < 400 and (stream := await srv.accept()) is not None:
            got.append(stream)
            await asyncio.sleep(0)

    taker = asyncio.create_task(take())
    for k in range(400):
        await client.send(spdy.SynStream(1 + 2 * k, {"streamtype": ["data"]}, fin=True,
                                         unidirectional=True))  # fmt: skip
    await asyncio.wait_for(taker, 10)
    assert srv.abuse is None and len(got) == 400
