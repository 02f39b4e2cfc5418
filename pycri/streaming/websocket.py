"""The WebSocket transport of the streaming server: wsproto's framing under asyncio.

A client asking for `Upgrade: websocket` gets the same exec, attach and port-forward
as over SPDY, carried in one of two ways:

- channel framing (`*channel.k8s.io`): every message starts with a channel number
  (exec/attach: 0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize; port-forward: 2n data
  and 2n+1 error for the request's n-th port). The `base64.` variants send text
  messages, the channel as an ASCII digit and the payload base64-encoded. v5 adds a
  close signal, the binary message `255, <channel>`, which ends that channel's input
  (how a client closes stdin). Nothing closes one channel toward the client: the
  connection's normal closure ends them all.
- a SPDY tunnel (`SPDY/3.1+portforward.k8s.io`, client-go's port-forward dialer):
  binary messages carry a SPDY/3.1 byte stream, and the SPDY session runs over it.

wsproto validates the handshake and does the framing (no extensions are negotiated,
so nothing inflates). What a peer can make us hold is bounded as on SPDY: a message
over MAX_FRAME closes the connection with 1009 and the reason, and received bytes wait
in bounded per-channel and per-connection buffers (pycri.streaming.inbox); past them
the read loop stops reading, and TCP pushes back. Pings and pongs past
limits.CONTROL_BURST close it with 1008, and the read loop yields to the event loop
every limits.SLICE, however small the messages.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
from collections.abc import Iterable
from typing import Protocol

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    Pong,
    TextMessage,
)
from wsproto.utilities import ProtocolError

from pycri.streaming.inbox import MAX_SESSION_BUFFER, Inbox, Pool
from pycri.streaming.limits import MAX_FRAME, Pacer, Rate
from pycri.streaming.session import CHUNK, LINGER, Reader, Writer, hang_up

log = logging.getLogger(__name__)

CLOSE_SIGNAL = 255
TUNNEL_PREFIX = "SPDY/3.1+"
# Close codes (RFC 6455 section 7.4.1).
NORMAL, PROTOCOL_ERROR, UNSUPPORTED, BAD_DATA, POLICY, TOO_BIG = (
    1000, 1002, 1003, 1007, 1008, 1009)
# After we closed on an abusive peer, how long its remaining input is read and dropped,
# so our close frame reaches it instead of being lost to a reset.
ABORT_LINGER = 2.0


def server() -> WSConnection:
    return WSConnection(ConnectionType.SERVER)


def is_base64(protocol: str) -> bool:
    return "base64." in protocol


class Receiver(Protocol):
    """What takes a connection's complete messages (channel framing or a tunnel)."""

    async def on_message(self, data: bytes, text: bool) -> None: ...

    def end(self, drop: bool) -> None:
        """No more input; with `drop`, what was not read goes too (nobody will read it,
        or nobody is there to have it delivered)."""


class Connection:
    """One upgraded connection: its read loop, its writes, and its close."""

    def __init__(self, reader: Reader, writer: Writer, ws: WSConnection, *,
                 max_message: int = MAX_FRAME,
                 max_buffer: int = MAX_SESSION_BUFFER,
                 budget: Pool | None = None) -> None:  # fmt: skip
        """`budget`: the server's pool of all connections' unread bytes, if any."""
        self.reader = reader
        self.writer = writer
        self.ws = ws
        self.max_message = max_message
        # Bytes received on all channels, not yet read.
        self.pool = Pool(max_buffer, budget, peer_alive=self._peer_alive)
        self._control = Rate()
        self.closed = asyncio.Event()  # the peer's side is over (close frame, EOF, abort)
        self.abuse: str | None = None  # why we closed on the peer, if we did
        self._message = bytearray()
        self._text = False
        self._receiver: Receiver | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, receiver: Receiver) -> None:
        self._receiver = receiver
        self._task = asyncio.create_task(self._read_loop())

    @property
    def gone(self) -> bool:
        """The peer is gone (reset, or found gone while its input waited for room)."""
        return self.pool.peer_gone or self.writer.is_closing()

    @property
    def open(self) -> bool:
        return self.ws.state is ConnectionState.OPEN and not self.writer.is_closing()

    def send_now(self, event: Event) -> None:
        """Frame and write without waiting (the order on the wire is the order of calls)."""
        if self.open or (isinstance(event, CloseConnection) and not self.writer.is_closing()
                         and self.ws.state is ConnectionState.REMOTE_CLOSING):  # fmt: skip
            self.writer.write(self.ws.send(event))

    async def drain(self) -> None:
        try:
            await self.writer.drain()
        except (ConnectionError, OSError):
            self._end()

    async def _peer_alive(self) -> bool:
        """Write a ping: a peer that hung up answers with a reset, which the next probe
        (or this one) finds as a closed transport."""
        if self.open:
            self.send_now(Ping(b"pycri"))
            await self.drain()
        return not self.writer.is_closing()

    async def send(self, data: bytes | str) -> None:
        """One message: text for a str, binary for bytes; dropped once the connection ends."""
        if not self.open:
            return
        self.send_now(TextMessage(data) if isinstance(data, str) else BytesMessage(data))
        await self.drain()

    def abort(self, code: int, reason: str) -> None:
        """Close on a peer that broke the protocol or a bound: the close frame says why,
        then its input is only read and dropped until it hangs up (ABORT_LINGER at most)."""
        if self.abuse is None:
            self.abuse = reason
            log.warning("closing WebSocket streaming connection: %s", reason)
        with contextlib.suppress(Exception):
            self.send_now(CloseConnection(code, reason[:120]))
            if self.writer.can_write_eof():
                self.writer.write_eof()
        self._end()

    async def close(self, linger: float = LINGER) -> None:
        """Normal closure, then hang up once the peer answers (hang_up)."""
        if self.open:
            self.send_now(CloseConnection(NORMAL))
            await self.drain()
        await hang_up(self.writer, self._task, linger)
        self._end()
        if self._receiver is not None:  # the application is done: its unread input goes
            self._receiver.end(drop=True)
        self.pool.release()

    def _end(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        self.pool.close()
        if self._receiver is not None:
            self._receiver.end(drop=self.gone)

    async def _read_loop(self) -> None:
        pacer = Pacer()
        try:
            while self.abuse is None:
                data = await self.reader.read(65536)
                pacer.restart()
                self.ws.receive_data(data or None)
                for event in self.ws.events():  # parsed one at a time, as taken
                    await self._dispatch(event)
                    if self.abuse is not None:
                        break
                    await pacer.tick()
                if not data or self.ws.state is ConnectionState.CLOSED:
                    return
            loop = asyncio.get_running_loop()
            deadline = loop.time() + ABORT_LINGER
            while await asyncio.wait_for(self.reader.read(65536), deadline - loop.time()):
                pass
        except (ConnectionError, OSError, TimeoutError, ProtocolError):
            pass
        finally:
            self._end()

    async def _dispatch(self, event: Event) -> None:
        if isinstance(event, Message):
            part = event.data.encode() if isinstance(event.data, str) else event.data
            if len(self._message) + len(part) > self.max_message:
                self.abort(TOO_BIG, f"message of more than {self.max_message} bytes "
                           f"(the limit is {self.max_message})")  # fmt: skip
                return
            self._text = isinstance(event, TextMessage)
            if not event.message_finished:
                self._message += part
                return
            if self._message:
                self._message += part
                part = bytes(self._message)
                self._message.clear()
            assert self._receiver is not None
            await self._receiver.on_message(part, self._text)
        elif isinstance(event, (Ping, Pong)):
            if not self._control.take():
                self.abort(POLICY, f"more than {self._control.burst} control frames (pings, "
                           f"pongs) at once; at most {self._control.per_second:.0f} a second")
                return
            if isinstance(event, Ping):
                self.send_now(event.response())
                await self.drain()
        elif isinstance(event, CloseConnection):
            if self.ws.state is ConnectionState.REMOTE_CLOSING:  # the peer closes: answer
                self.send_now(event.response())
                await self.drain()
                self._end()
            elif self.ws.state is ConnectionState.OPEN:  # wsproto could not parse a frame
                self.abort(event.code, f"protocol error from peer: {event.reason}")
            else:
                self._end()


class Channel:
    """One channel of the framing, for the protocol code as a SPDY stream would be:
    `read` until b"", `write`, `close`, and `aborted` once the connection is gone."""

    def __init__(self, mux: ChannelMux, number: int) -> None:
        self.mux = mux
        self.number = number
        self.input = Inbox(mux.conn.pool)
        self.aborted = asyncio.Event()
        self.local_done = False

    async def read(self) -> bytes:
        return await self.input.read()

    async def write(self, data: bytes) -> None:
        for start in range(0, len(data), CHUNK):
            if self.local_done:
                return
            await self.mux.send(self.number, data[start : start + CHUNK])

    async def announce(self) -> None:
        """An empty message on this channel (kubelet's "the streams are ready")."""
        await self.mux.send(self.number, b"")

    async def close(self) -> None:
        """Done with the channel both ways (the wire has no per-channel close)."""
        self.local_done = True
        self.input.end()


class ChannelMux:
    """The channel framing over a connection: demultiplexes what the peer sends on its
    `inputs` (anything on other channels is dropped, as kubelet does) and frames writes."""

    def __init__(self, conn: Connection, protocol: str, inputs: Iterable[int], *,
                 close_signal: bool) -> None:  # fmt: skip
        self.conn = conn
        self.base64 = is_base64(protocol)
        self.close_signal = close_signal
        self.inputs = set(inputs)
        self.channels: dict[int, Channel] = {}

    def channel(self, number: int) -> Channel:
        if number not in self.channels:
            self.channels[number] = Channel(self, number)
        return self.channels[number]

    async def send(self, number: int, data: bytes) -> None:
        if self.base64:
            await self.conn.send(chr(ord("0") + number) + base64.b64encode(data).decode())
        else:
            await self.conn.send(bytes([number]) + data)

    async def on_message(self, data: bytes, text: bool) -> None:
        if not data:
            return
        if self.close_signal and data[0] == CLOSE_SIGNAL and not text:
            if len(data) != 2:
                self.conn.abort(PROTOCOL_ERROR, "a close signal names exactly one channel")
            elif data[1] in self.inputs:
                self.channel(data[1]).input.end()
            return
        number = data[0] - ord("0") if self.base64 else data[0]
        if number not in self.inputs:
            return
        payload = data[1:]
        if self.base64:
            try:
                payload = base64.b64decode(payload, validate=True)
            except binascii.Error:
                self.conn.abort(BAD_DATA, f"channel {number}: the payload is not base64")
                return
        await self.channel(number).input.put(payload)

    def end(self, drop: bool) -> None:
        for ch in self.channels.values():
            if drop:
                ch.input.discard()
            ch.input.end()
            ch.aborted.set()


class Tunnel:
    """A byte stream over binary messages, read and written by a SPDY session."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.input = Inbox(conn.pool, conn.pool.limit)

    async def on_message(self, data: bytes, text: bool) -> None:
        if text:
            self.conn.abort(UNSUPPORTED, "the SPDY tunnel carries binary messages only")
            return
        await self.input.put(data)

    def end(self, drop: bool) -> None:
        if drop:
            self.input.discard()
        self.input.end()

    async def read(self, n: int = -1) -> bytes:
        return await self.input.read(n)

    def write(self, data: bytes) -> None:
        if self.conn.open:
            self.conn.send_now(BytesMessage(data))

    async def drain(self) -> None:
        await self.conn.drain()

    def is_closing(self) -> bool:
        return not self.conn.open

    def can_write_eof(self) -> bool:
        return False  # only the whole connection closes

    def write_eof(self) -> None:
        raise OSError("a WebSocket tunnel has no half-close")

    def close(self) -> None:
        if self.conn.open:
            self.conn.send_now(CloseConnection(NORMAL))

    async def wait_closed(self) -> None:
        return None
