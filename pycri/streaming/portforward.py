"""The port-forward protocol (`portforward.k8s.io`) over a SPDY session or a WebSocket.

For every local connection the client opens two streams carrying the same `port`
and `requestID` headers: `streamType: error` (it only reads it) and
`streamType: data`. The server connects to that port in the pod and copies bytes
both ways; the client's FIN half-closes the TCP connection, the pod's FIN
half-closes the data stream. When the copying ends the server closes the error
stream — with a message in it if the connection failed — and the client moves on.

A reset of either stream (or the session's end) closes the pod connection at once,
and a session forwards at most `max_connections` connections at a time, each
holding a file descriptor taken from the streaming server's budget.

Over a WebSocket's channel framing (`v4.channel.k8s.io`, as kubelet serves it) there
is one connection per port of the request, dialled at once: channel 2n carries the
n-th port's data both ways, 2n+1 its error, and the server's first message on each is
the port as 2 little-endian bytes. The protocol has no half-close, so the pod's FIN
ends that port's forwarding; the session ends when every port's has. (client-go's
WebSocket dialer instead tunnels SPDY, served by `serve_spdy` unchanged.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pycri.streaming import websocket
from pycri.streaming.limits import Budget
from pycri.streaming.session import Session, Stream

log = logging.getLogger(__name__)

PROTOCOL = "portforward.k8s.io"
MAX_CONNECTIONS = 64
# WebSocket sub-protocols: kubelet's channel framing ("" when none was offered) and
# client-go's SPDY tunnel.
WEBSOCKET_CHANNELS = ["v4.channel.k8s.io", "v4.base64.channel.k8s.io", ""]
WEBSOCKET_TUNNEL = websocket.TUNNEL_PREFIX + PROTOCOL
WEBSOCKET_PROTOCOLS = [WEBSOCKET_TUNNEL, *WEBSOCKET_CHANNELS]


class Channel(Protocol):
    """One direction pair of a forwarded connection: a SPDY stream or a WebSocket channel."""

    aborted: asyncio.Event

    async def read(self) -> bytes: ...

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...

Dialer = Callable[[int], Awaitable[socket.socket]]
"""Connects to a port inside the pod."""


async def _to_pod(data: Channel, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await data.read():
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _from_pod(reader: asyncio.StreamReader, data: Channel) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await reader.read(65536):
            await data.write(chunk)
    await data.close()


async def _refuse(data: Channel, error: Channel, message: str) -> None:
    await error.write(message.encode())
    await error.close()
    await data.close()


async def forward(port_text: str, data: Channel, error: Channel, dial: Dialer) -> None:
    """Serve one forwarded connection; the error stream is closed however it ends."""
    try:
        port = int(port_text)
        sock = await dial(port)
    except Exception as e:  # bad port, pod gone, connection refused: all told to the client
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        await _refuse(data, error, f"error forwarding port {port_text} to pod: {reason}")
        return
    try:
        reader, writer = await asyncio.open_connection(sock=sock)
    except OSError:
        sock.close()
        raise
    inbound = asyncio.create_task(_to_pod(data, writer))
    outbound = asyncio.create_task(_from_pod(reader, data))
    # Done when both directions are (the client resets or half-closes the data stream
    # once it has our FIN), or at once when the client resets a stream.
    both: asyncio.Future[Any] = asyncio.gather(inbound, outbound)
    aborted: list[asyncio.Future[Any]] = [
        asyncio.create_task(s.aborted.wait()) for s in (data, error)]
    try:
        await asyncio.wait([both, *aborted], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (inbound, outbound, *aborted):
            task.cancel()
        await asyncio.gather(both, *aborted, return_exceptions=True)
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await writer.wait_closed()
        await error.close()


async def serve_spdy(session: Session, dial: Dialer, fds: Budget | None = None,
                     max_connections: int = MAX_CONNECTIONS) -> None:  # fmt: skip
    """Pair streams by request id and forward each pair until the client hangs up.

    Past `max_connections` at once (or with no fd left in `fds`) a pair is refused on
    its error stream; a client holding more unpaired streams than that is abusive."""
    pending: dict[str, dict[str, Stream]] = {}
    tasks: set[asyncio.Task[None]] = set()
    fds = fds if fds is not None else Budget(max_connections)

    def finished(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        fds.give()

    try:
        while (stream := await session.accept()) is not None:
            kind = stream.header("streamtype")
            if kind not in ("data", "error") or not stream.header("port"):
                await stream.reset()
                continue
            key = stream.header("requestid") or stream.header("port")
            pair = pending.setdefault(key, {})
            if kind in pair:
                await stream.reset()
                continue
            pair[kind] = stream
            if len(pending) > max_connections:
                session.abort(f"port-forward client left more than {max_connections} "
                              "stream pairs unfinished")  # fmt: skip
                return
            if len(pair) < 2:
                continue
            del pending[key]
            port = stream.header("port")
            if len(tasks) >= max_connections or not fds.take():
                limit = (f"{max_connections} in this session" if len(tasks) >= max_connections
                         else "the node's streaming file descriptor budget")  # fmt: skip
                await _refuse(pair["data"], pair["error"], f"error forwarding port {port} to "
                              f"pod: too many forwarded connections ({limit}); try again later")
                continue
            task = asyncio.create_task(forward(port, pair["data"], pair["error"], dial))
            tasks.add(task)
            task.add_done_callback(finished)
    finally:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def serve_websocket(conn: websocket.Connection, protocol: str, ports: list[int],
                          dial: Dialer, fds: Budget | None = None,
                          max_connections: int = MAX_CONNECTIONS) -> None:  # fmt: skip
    """Forward each port of the request over its channel pair until every one is done
    (module docstring); ports past `max_connections` or the fd budget are refused on
    their error channel like a SPDY pair."""
    mux = websocket.ChannelMux(conn, protocol, range(0, 2 * len(ports), 2), close_signal=False)
    conn.start(mux)
    fds = fds if fds is not None else Budget(max_connections)
    pairs = [(port, mux.channel(2 * i), mux.channel(2 * i + 1)) for i, port in enumerate(ports)]
    for port, data, error in pairs:
        prefix = struct.pack("<H", port)
        await data.write(prefix)
        await error.write(prefix)

    async def one(index: int, port: int, data: Channel, error: Channel) -> None:
        if index >= max_connections or not fds.take():
            limit = (f"{max_connections} in this session" if index >= max_connections
                     else "the node's streaming file descriptor budget")  # fmt: skip
            await _refuse(data, error, f"error forwarding port {port} to pod: too many "
                          f"forwarded connections ({limit}); try again later")  # fmt: skip
            return
        try:
            await forward(str(port), data, error, dial)
        finally:
            fds.give()

    await asyncio.gather(*(one(i, *pair) for i, pair in enumerate(pairs)))
