"""Serve gRPC through a socket-activated listener by relaying to gRPC's own socket.

grpc-python can only listen on an address it binds itself; it cannot take over an
inherited listening fd. Re-binding the activated socket's path instead would orphan
systemd's listener and lose connections queued in it, which is the point of socket
activation (a kubelet connecting while pycri restarts waits in the backlog instead
of failing). So connections are accepted on the inherited fd and relayed, byte for
byte, to a private socket gRPC listens on. The kubelet keeps one long-lived HTTP/2
connection, so the cost is one extra copy per byte (hack/bench-activation.py; the
numbers are in docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CHUNK = 256 * 1024


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close, so each side sees the other's shutdown."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:  # a reset from either side ends this direction
        pass


class SocketProxy:
    """Accepts on `listener` and relays every connection to the unix socket `upstream`."""

    def __init__(self, listener: socket.socket, upstream: Path) -> None:
        self._listener = listener
        self._upstream = str(upstream)
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._listener.setblocking(False)
        # Python 3.13+ unlinks a unix server's path on close unless told not to; this
        # path is systemd's listener and must outlive us.
        keep: dict[str, Any] = {"cleanup_socket": False} if sys.version_info >= (3, 13) else {}
        self._server = await asyncio.start_unix_server(
            self._relay, sock=self._listener, limit=CHUNK, **keep
        )

    def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._conns.add(task)
        task.add_done_callback(self._conns.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self._upstream, limit=CHUNK)
        except OSError as e:
            log.warning("activated socket: cannot reach %s: %s", self._upstream, e)
            writer.close()
            return
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(OSError):
                    await w.wait_closed()

    def stop_accepting(self) -> None:
        """Close our copy of the listener; systemd's copy keeps queueing for the next run."""
        if self._server is not None:
            self._server.close()
            self._server = None

    async def close(self) -> None:
        """Drop relays still open (after gRPC's graceful stop has ended its side)."""
        self.stop_accepting()
        self._listener.close()  # if start() never ran
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
