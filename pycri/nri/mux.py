"""The NRI connection multiplexer: several byte streams over one unix socket.

Every frame on the socket is an 8-byte big-endian header (uint32 connection id,
uint32 payload length) and the payload, a piece of that connection's byte stream.
NRI opens two connections: PLUGIN_SERVICE_CONN (1) carries the runtime's calls to
the plugin's services, RUNTIME_SERVICE_CONN (2) the plugin's calls to the runtime.
Connection 0 is reserved. Opening is local: no signalling goes over the wire, and
frames for a connection nobody opened are dropped, as the protocol's own mux does.

Frame sizes matter to a Go peer: its mux hands each frame to one Read of a 4 KiB
buffered reader, and a frame larger than the space that Read offers is an error on
its side. `send` therefore cuts every message the way a Go ttrpc peer writes its own
(the first 4096 bytes, then the rest), so each frame fits the read it lands in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable

from pycri.nri.ttrpc import HEADER_LEN, MAX_MESSAGE, Channel, Handler

log = logging.getLogger(__name__)

FRAME = struct.Struct(">II")
PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2
MAX_PAYLOAD = HEADER_LEN + MAX_MESSAGE  # the protocol's maxPayloadSize
GO_READ_BUFFER = 4096  # bufio's default size on the Go side
MAX_UNSENT = 2 * MAX_PAYLOAD  # bytes queued for a peer that does not read, before dropping it


def frames(conn_id: int, data: bytes) -> bytes:
    """`data` (one ttrpc message) as mux frames a Go reader accepts."""
    chunks = [data[:GO_READ_BUFFER]]
    rest = data[GO_READ_BUFFER:]
    while rest:
        chunks.append(rest[:MAX_PAYLOAD])
        rest = rest[MAX_PAYLOAD:]
    return b"".join(FRAME.pack(conn_id, len(c)) + c for c in chunks if c)


class Mux:
    """One trunk socket, demultiplexed to per-connection `on_data` callbacks.

    The trunk is owned from construction on: close() (or the peer leaving, or a frame
    over MAX_PAYLOAD) closes it and calls every connection's `on_close` once."""

    def __init__(self, sock: socket.socket, *, name: str = "nri") -> None:
        self._sock = sock
        self._name = name
        self._conns: dict[int, tuple[Callable[[bytes], None], Callable[[str], None]]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.reason = ""

    def open(self, conn_id: int, on_data: Callable[[bytes], None],
             on_close: Callable[[str], None]) -> Callable[[bytes], asyncio.Future[None]]:
        """Registers a connection; returns its sender (an awaitable per message)."""
        if conn_id == 0:
            raise ValueError("mux connection id 0 is reserved")
        self._conns[conn_id] = (on_data, on_close)

        def send(data: bytes) -> asyncio.Future[None]:
            return asyncio.ensure_future(self._write(frames(conn_id, data)))
        return send

    async def start(self) -> None:
        """Starts reading; open() every connection first so no frame is dropped."""
        reader, self._writer = await asyncio.open_unix_connection(sock=self._sock)
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))

    async def _write(self, data: bytes) -> None:
        if self._writer is None or self.closed.is_set():
            raise ConnectionResetError(f"{self._name}: connection closed ({self.reason})")
        if self._writer.transport.get_write_buffer_size() + len(data) > MAX_UNSENT:
            reason = f"peer is not reading: over {MAX_UNSENT} bytes unsent"
            log.warning("%s: closing connection: %s", self._name, reason)
            self.abort(reason)
            raise ConnectionResetError(f"{self._name}: {reason}")
        self._writer.write(data)  # one call per message: frames never interleave
        await self._writer.drain()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        reason = "peer closed the connection"
        try:
            while True:
                header = await reader.readexactly(FRAME.size)
                conn_id, length = FRAME.unpack(header)
                if length > MAX_PAYLOAD:
                    reason = (f"mux frame of {length} bytes exceeds the {MAX_PAYLOAD}-byte "
                              "limit: protocol violation")
                    log.warning("%s: closing connection: %s", self._name, reason)
                    break
                payload = await reader.readexactly(length)
                conn = self._conns.get(conn_id)
                if conn is None:
                    log.debug("%s: %d bytes for unopened connection %d dropped",
                              self._name, length, conn_id)
                    continue
                conn[0](payload)
                if self.closed.is_set():  # the payload made its channel give up
                    return
        except asyncio.IncompleteReadError:
            pass
        except OSError as e:
            reason = f"connection error: {e}"
        self.abort(reason)

    def abort(self, reason: str) -> None:
        """Drops the trunk now (sync, for callbacks); close() also waits for the reader.
        Unsent bytes are discarded: a peer that stopped reading must not hold the fd."""
        if self.closed.is_set():
            return
        self.reason = reason
        self.closed.set()
        if self._writer is not None:
            self._writer.transport.abort()
        else:
            self._sock.close()
        for _, on_close in list(self._conns.values()):
            on_close(reason)

    async def close(self, reason: str = "closed locally") -> None:
        """Closes the trunk and waits until the reader and the socket are gone."""
        self.abort(reason)
        task = self._reader_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._writer is not None:
            with contextlib.suppress(OSError, RuntimeError):
                await self._writer.wait_closed()


class Wire:
    """An NRI peer's two ttrpc channels over one trunk: it calls the other side's
    services on `call_conn` and serves its own on `serve_conn` (the runtime calls on
    PLUGIN_SERVICE_CONN and serves RUNTIME_SERVICE_CONN; a plugin the other way round).

    `closed` is set once the trunk is gone, for whatever reason (`reason` says which);
    by then every pending call has failed with UNAVAILABLE."""

    def __init__(self, sock: socket.socket, *, call_conn: int, serve_conn: int,
                 handler: Handler, name: str = "nri") -> None:
        self.mux = Mux(sock, name=name)
        self.client = Channel(self.mux.open(call_conn, self._client_data, self._gone),
                              None, name=f"{name}/client", on_error=self.mux.abort)
        self.server = Channel(self.mux.open(serve_conn, self._server_data, self._gone),
                              handler, name=f"{name}/server", on_error=self.mux.abort)
        self.closed = self.mux.closed

    @property
    def reason(self) -> str:
        return self.mux.reason

    def _client_data(self, data: bytes) -> None:
        self.client.feed(data)

    def _server_data(self, data: bytes) -> None:
        self.server.feed(data)

    def _gone(self, reason: str) -> None:
        self.client.close(reason)
        self.server.close(reason)

    async def start(self) -> None:
        await self.mux.start()

    async def call(self, service: str, method: str, payload: bytes, timeout: float) -> bytes:
        return await self.client.call(service, method, payload, timeout)

    async def close(self, reason: str = "closed locally") -> None:
        """Closes the trunk and waits for the reader and every served request to end."""
        await self.mux.close(reason)
        await self.server.wait_closed()
