"""The port-forward protocol (`portforward.k8s.io`) over a SPDY session.

For every local connection the client opens two streams carrying the same `port`
and `requestID` headers: `streamType: error` (it only reads it) and
`streamType: data`. The server connects to that port in the pod and copies bytes
both ways; the client's FIN half-closes the TCP connection, the pod's FIN
half-closes the data stream. When the copying ends the server closes the error
stream — with a message in it if the connection failed — and the client moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable

from pycri.streaming.session import Session, Stream

log = logging.getLogger(__name__)

PROTOCOL = "portforward.k8s.io"

Dialer = Callable[[int], Awaitable[socket.socket]]
"""Connects to a port inside the pod."""


async def _to_pod(data: Stream, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await data.read():
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _from_pod(reader: asyncio.StreamReader, data: Stream) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await reader.read(65536):
            await data.write(chunk)
    await data.close()


async def forward(port_text: str, data: Stream, error: Stream, dial: Dialer) -> None:
    """Serve one forwarded connection; the error stream is closed however it ends."""
    try:
        port = int(port_text)
        sock = await dial(port)
    except Exception as e:  # bad port, pod gone, connection refused: all told to the client
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        await error.write(f"error forwarding port {port_text} to pod: {reason}".encode())
        await error.close()
        await data.close()
        return
    try:
        reader, writer = await asyncio.open_connection(sock=sock)
    except OSError:
        sock.close()
        raise
    inbound = asyncio.create_task(_to_pod(data, writer))
    try:
        await _from_pod(reader, data)
        # The client resets or half-closes the data stream once it has our FIN.
        await inbound
    finally:
        inbound.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await inbound
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await writer.wait_closed()
        await error.close()


async def serve_spdy(session: Session, dial: Dialer) -> None:
    """Pair streams by request id and forward each pair until the client hangs up."""
    pending: dict[str, dict[str, Stream]] = {}
    tasks: set[asyncio.Task[None]] = set()
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
            if len(pair) == 2:
                del pending[key]
                task = asyncio.create_task(
                    forward(stream.header("port"), pair["data"], pair["error"], dial)
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)
    finally:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
