"""An asyncio SPDY/3.1 session: multiplexed byte streams over one upgraded connection.

Either side may open streams (the server only accepts them in practice; the client
role exists for pycri's own tests). Flow control is not enforced: spdystream, the
only client that speaks SPDY to a CRI streaming server, neither sends nor honours
WINDOW_UPDATE, so data is buffered as it arrives and written as it is produced.
What a peer can make a session hold is bounded instead: bytes unread per stream and
per session (pycri.streaming.inbox: past them the session stops reading, and TCP pushes
back), and streams of every kind; a peer that keeps opening refused streams, or sends
control frames past limits.CONTROL_BURST, has the session closed. The read loop parses
one frame at a time and yields to the event loop every limits.SLICE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from pycri.streaming import spdy
from pycri.streaming.inbox import MAX_SESSION_BUFFER, Inbox, Pool
from pycri.streaming.limits import Pacer, Rate

log = logging.getLogger(__name__)

CHUNK = 32 * 1024
# After our last frame, how long the peer gets to read everything and hang up.
LINGER = 10.0

# Streams one session may hold at once, counting half-closed ones and ones the
# application has not accepted yet (exec uses up to 5, port-forward 2 per connection).
MAX_STREAMS = 128
# At that bound with streams not yet accepted, how long the application gets to take
# them (a burst of honest opens outruns it) before new ones are refused.
ACCEPT_GRACE = 2.0


# Frames that neither open nor end a stream nor carry its data: each costs a parse (a
# header block inflated, for SYN_REPLY and HEADERS) and a PING an answer, so a session
# takes only so many (limits.Rate).
CONTROL = (spdy.SynReply, spdy.HeadersFrame, spdy.Settings, spdy.Ping, spdy.GoAway,
           spdy.WindowUpdate, spdy.Unknown)


class Reader(Protocol):
    """Where a session reads its bytes: the upgraded connection, or a WebSocket tunnel."""

    async def read(self, n: int = -1) -> bytes: ...


class Writer(Protocol):
    """Where a session writes: what it uses of asyncio.StreamWriter."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def is_closing(self) -> bool: ...

    def can_write_eof(self) -> bool: ...

    def write_eof(self) -> None: ...

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


async def hang_up(writer: Writer, reader: asyncio.Task[None] | None,
                  linger: float = LINGER) -> None:
    """The end of a SPDY session or a WebSocket connection, once its goodbye is sent:
    give the peer `linger` seconds to read it and hang up (the read loop `reader` then
    ends; closing with its input unread would reset the connection and could lose what
    was sent last), then close the transport and stop the read loop."""
    if reader is not None:
        await asyncio.wait({reader}, timeout=linger)
    writer.close()
    if reader is not None:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
    with contextlib.suppress(OSError, ConnectionError):
        await writer.wait_closed()


class Abuse(Exception):
    """The peer goes past a bound no honest client reaches; the session is closed."""


class Stream:
    """One SPDY stream: `read` until b"" (peer FIN, reset or session end); `write`, `close`."""

    def __init__(self, session: Session, stream_id: int, headers: spdy.Headers) -> None:
        self.session = session
        self.id = stream_id
        self.headers = headers
        self.input = Inbox(session.pool)
        self.remote_done = False
        self.local_done = False
        self.was_reset = False
        self.replied = asyncio.Event()
        # Set when the stream is reset or its session ends: whatever serves it should stop.
        self.aborted = asyncio.Event()
        # A stream the peer opened counts against the session until the application took it.
        self.accepted = True

    def header(self, name: str) -> str:
        values = self.headers.get(name.lower())
        return values[0] if values else ""

    async def read(self) -> bytes:
        return await self.input.read()

    async def read_all(self) -> bytes:
        out = bytearray()
        while chunk := await self.read():
            out += chunk
        return bytes(out)

    async def write(self, data: bytes) -> None:
        """Send data; silently dropped once the stream is closed or reset (the peer is gone)."""
        for start in range(0, len(data), CHUNK):
            if self.local_done or self.was_reset:
                return
            await self.session.send(spdy.DataFrame(self.id, data[start : start + CHUNK]))

    async def close(self) -> None:
        """Half-close: FIN our direction (once)."""
        if self.local_done or self.was_reset:
            return
        self.local_done = True
        await self.session.send(spdy.DataFrame(self.id, b"", fin=True))
        self.session.forget_if_done(self)

    async def reset(self, status: int = spdy.CANCEL) -> None:
        if self.was_reset:
            return
        self._on_reset()
        await self.session.send(spdy.RstStream(self.id, status))

    # -- fed by the session --------------------------------------------------------

    async def _on_data(self, data: bytes, fin: bool) -> None:
        if self.remote_done:
            return
        # Backpressure: the session reads no further until this stream, and the session
        # as a whole, are back under their bounds (an ended input drops it). Not for a
        # stream the application never takes (one opened after an exec's channels): the
        # read loop would wait for ever, never see the peer hang up, and keep the session's
        # input until its process ended.
        if not self.accepted and self.input.would_wait(len(data)) and \
                not await self.session.taken(self, ACCEPT_GRACE):
            raise Abuse(f"peer sent more than {len(self.input)} bytes on stream {self.id}, "
                        f"which was not taken within {ACCEPT_GRACE:.0f}s")
        await self.input.put(data)
        if fin:
            self._on_remote_fin()

    def _on_remote_fin(self) -> None:
        if not self.remote_done:
            self.remote_done = True
            self.input.end()
            self.session.forget_if_done(self)

    def _on_reset(self) -> None:
        self.was_reset = True
        self.local_done = True
        self.replied.set()
        self.aborted.set()
        self._on_remote_fin()  # a read loop waiting for room in this stream goes on


class Session:
    """Runs the read loop of one connection and hands out its streams."""

    def __init__(
        self,
        reader: Reader,
        writer: Writer,
        *,
        server: bool,
        max_streams: int = MAX_STREAMS,
        max_buffer: int = MAX_SESSION_BUFFER,
        budget: Pool | None = None,
    ) -> None:
        """`budget`: the server's pool of all connections' unread bytes, if any."""
        self.reader = reader
        self.writer = writer
        self.server = server
        self.max_streams = max_streams
        # Bytes received on all streams, not yet read.
        self.pool = Pool(max_buffer, budget, peer_alive=self._peer_alive)
        self._control = Rate()
        self._refused = 0
        self._taken = asyncio.Event()  # the application accepted a stream
        self._stalled = False  # it let a grace period pass without accepting any
        self.abuse: str | None = None  # why the session was closed on the peer, if it was
        self.codec = spdy.Codec()
        self.streams: dict[int, Stream] = {}
        self.incoming: asyncio.Queue[Stream | None] = asyncio.Queue()
        self.closed = asyncio.Event()
        self._next_id = 2 if server else 1
        self._next_ping = 2 if server else 1
        self._last_remote_id = 0
        self._pings: dict[int, asyncio.Future[None]] = {}
        self._going_away = False
        self._reader_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reader_task = asyncio.create_task(self._read_loop())

    async def send(self, frame: spdy.Frame) -> None:
        """Encode and write in one step (the header compressor's state must follow the
        byte order on the wire); a broken connection just ends the session."""
        if self.writer.is_closing():
            return
        self.writer.write(self.codec.encode(frame))
        try:
            await self.writer.drain()
        except (ConnectionError, OSError):
            self._end()

    async def taken(self, stream: Stream, grace: float) -> bool:
        """Whether the application takes `stream` within `grace` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while not stream.accepted and not self.closed.is_set():
            self._taken.clear()
            try:
                await asyncio.wait_for(self._taken.wait(), deadline - loop.time())
            except TimeoutError:
                return False
        return stream.accepted

    async def accept(self) -> Stream | None:
        """The next stream the peer opened (already replied to); None once the session ends.
        Streams the peer reset before they were accepted are skipped."""
        while (stream := await self.incoming.get()) is not None:
            stream.accepted = True
            self._taken.set()
            self._stalled = False
            self.forget_if_done(stream)
            if not stream.was_reset:
                return stream
            stream.input.discard()
        self.incoming.put_nowait(None)  # every later accept() sees the end too
        return None

    async def open(self, headers: spdy.Headers, timeout: float = 30.0) -> Stream:
        """Open a stream and wait for the peer's SYN_REPLY."""
        sid = self._next_id
        self._next_id += 2
        stream = Stream(self, sid, headers)
        self.streams[sid] = stream
        await self.send(spdy.SynStream(sid, headers))
        await asyncio.wait_for(stream.replied.wait(), timeout)
        if stream.was_reset:
            raise ConnectionResetError(f"stream {sid} was refused")
        return stream

    async def _peer_alive(self) -> bool:
        """Write a PING: a peer that hung up answers with a reset, which the next probe
        (or this one) finds as a closed transport."""
        if not self.writer.is_closing():
            self._next_ping += 2
            await self.send(spdy.Ping(self._next_ping - 2))
        return not self.writer.is_closing()

    async def ping(self, timeout: float = 10.0) -> None:
        pid = self._next_ping
        self._next_ping += 2
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pings[pid] = fut
        await self.send(spdy.Ping(pid))
        await asyncio.wait_for(fut, timeout)

    def forget_if_done(self, stream: Stream) -> None:
        if stream.local_done and stream.remote_done and stream.accepted:
            self.streams.pop(stream.id, None)

    def abort(self, reason: str) -> None:
        """Close the session on a peer that went past a bound: GOAWAY, then hang up
        without lingering (the peer is not owed the rest of its data)."""
        if self.abuse is None:
            self.abuse = reason
            log.warning("closing SPDY session: %s", reason)
        if not self.writer.is_closing():
            with contextlib.suppress(Exception):
                self.writer.write(self.codec.encode(
                    spdy.GoAway(self._last_remote_id, spdy.PROTOCOL_ERROR)))
            self.writer.close()
        if self._reader_task is not None and self._reader_task is not asyncio.current_task():
            self._reader_task.cancel()
        self._end()

    async def close(self, linger: float = LINGER) -> None:
        """Say GOAWAY, stop writing, then hang up (hang_up)."""
        if not self.writer.is_closing():
            await self.send(spdy.GoAway(self._last_remote_id))
            with contextlib.suppress(OSError, RuntimeError):
                if self.writer.can_write_eof():
                    self.writer.write_eof()
        await hang_up(self.writer, self._reader_task, linger)
        self._end()
        for stream in self.streams.values():  # the application is done with them: their
            stream.input.discard()  # unread input goes now, not when gc finds the cycle
        self.pool.release()

    def _end(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        # Input nobody will ever read (a stream never taken), or that nobody is there to
        # have delivered (the peer is gone: reset, or found gone while its input waited
        # for room; not a peer that only half-closed) goes now.
        gone = self.pool.peer_gone or self.writer.is_closing()
        for stream in list(self.streams.values()):
            if not stream.accepted or gone:
                stream.input.discard()
        self.pool.close()
        for stream in list(self.streams.values()):
            stream._on_remote_fin()
            stream.replied.set()
            stream.aborted.set()
        self.incoming.put_nowait(None)
        for fut in self._pings.values():
            if not fut.done():
                fut.set_exception(ConnectionResetError("session closed"))

    async def _read_loop(self) -> None:
        pacer = Pacer()
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                pacer.restart()
                self.codec.receive(data)
                for frame in self.codec.frames():
                    await self._dispatch(frame)
                    await pacer.tick()
        except spdy.SpdyError as e:
            log.info("SPDY protocol error from peer: %s", e)
            with contextlib.suppress(Exception):
                await self.send(spdy.GoAway(self._last_remote_id, spdy.PROTOCOL_ERROR))
        except Abuse as e:
            self.abort(str(e))
        except (ConnectionError, OSError):
            pass
        finally:
            self._end()

    async def _dispatch(self, frame: spdy.Frame) -> None:
        if isinstance(frame, CONTROL) and not self._control.take():
            raise Abuse(f"peer sent more than {self._control.burst} control frames at once "
                        f"(PING, SETTINGS, WINDOW_UPDATE, ...; at most "
                        f"{self._control.per_second:.0f} a second)")
        if isinstance(frame, spdy.DataFrame):
            stream = self.streams.get(frame.stream_id)
            if stream is not None:
                await stream._on_data(frame.data, frame.fin)
        elif isinstance(frame, spdy.SynStream):
            await self._on_syn_stream(frame)
        elif isinstance(frame, spdy.SynReply):
            stream = self.streams.get(frame.stream_id)
            if stream is not None:
                stream.replied.set()
                if frame.fin:
                    stream._on_remote_fin()
        elif isinstance(frame, spdy.HeadersFrame):
            stream = self.streams.get(frame.stream_id)
            if stream is not None and frame.fin:
                stream._on_remote_fin()
        elif isinstance(frame, spdy.RstStream):
            stream = self.streams.get(frame.stream_id)
            if stream is not None:
                stream._on_reset()
                self.forget_if_done(stream)  # an unaccepted one still counts until taken
        elif isinstance(frame, spdy.Ping):
            if frame.ping_id % 2 == self._next_ping % 2:
                fut = self._pings.pop(frame.ping_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            else:
                await self.send(frame)
        elif isinstance(frame, spdy.GoAway):
            # The peer opens nothing more; streams already open finish normally.
            self._going_away = True
        # SETTINGS and WINDOW_UPDATE need no answer: no flow control (module docstring);
        # unknown control frames are ignored, as the spec asks.

    async def _on_syn_stream(self, frame: spdy.SynStream) -> None:
        sid = frame.stream_id
        own_parity = self._next_id % 2
        if sid % 2 == own_parity or sid <= self._last_remote_id or self._going_away:
            await self._refuse(sid, spdy.PROTOCOL_ERROR)
            return
        if len(self.streams) >= self.max_streams and not await self._room_for_stream():
            await self._refuse(sid, spdy.REFUSED_STREAM)
            return
        self._last_remote_id = sid
        stream = Stream(self, sid, frame.headers)
        stream.accepted = False
        stream.replied.set()
        if frame.unidirectional:
            stream.local_done = True
        self.streams[sid] = stream
        await self.send(spdy.SynReply(sid, {}))
        if frame.fin:
            stream._on_remote_fin()
        self.incoming.put_nowait(stream)

    async def _room_for_stream(self) -> bool:
        """At the stream bound, wait up to ACCEPT_GRACE for the application to take
        the streams it has not (once: an application that stopped accepting, like an
        exec that has its channels, is not waited for again until it takes one)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ACCEPT_GRACE
        while (len(self.streams) >= self.max_streams and not self.incoming.empty()
               and not self._stalled and not self.closed.is_set()):  # fmt: skip
            self._taken.clear()
            try:
                await asyncio.wait_for(self._taken.wait(), deadline - loop.time())
            except TimeoutError:
                self._stalled = True
        return len(self.streams) < self.max_streams

    async def _refuse(self, sid: int, status: int) -> None:
        """Reset a stream we will not take; a peer that keeps opening them is abusive
        (an honest one stops when its streams are refused)."""
        self._refused += 1
        if self._refused > self.max_streams:
            raise Abuse(f"peer opened {self._refused} streams that were refused "
                        f"(at most {self.max_streams} may be open at once)")  # fmt: skip
        await self.send(spdy.RstStream(sid, status))
