"""A hostile streaming client: floods, idle and half-open connections, malformed frames.

Each attack speaks raw bytes (pycri's own codec only encodes the frames), reads what
the server sends back on the side so the server is never blocked on us, and reports
whether the server hung up. Used by tests/streaming/test_abuse.py with small counts
and by hack/stream-abuse.py with big ones. Loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Request

from pycri.streaming import spdy


@dataclass(frozen=True)
class Usage:
    rss_kib: int
    fds: int


def usage(pid: int) -> Usage:
    """The process's resident memory (VmRSS) and its number of open fds."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return Usage(rss, len(os.listdir(f"/proc/{pid}/fd")))


def request_head(url: str, protocols: list[str]) -> bytes:
    parts = urlsplit(url)
    lines = [f"POST {parts.path} HTTP/1.1", f"Host: {parts.netloc}",
             "Connection: Upgrade", "Upgrade: SPDY/3.1", "Content-Length: 0"]  # fmt: skip
    lines += [f"X-Stream-Protocol-Version: {p}" for p in protocols]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass
class Raw:
    """One upgraded connection driven frame by frame."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    codec: spdy.Codec = field(default_factory=spdy.Codec)
    received: list[spdy.Frame] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    @property
    def goaway(self) -> bool:
        return any(isinstance(f, spdy.GoAway) for f in self.received)

    def start(self) -> None:
        self._task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        """Read everything the server sends, so it is never blocked writing to us."""
        inbound = spdy.Codec()
        try:
            while data := await self.reader.read(1 << 16):
                with contextlib.suppress(spdy.SpdyError):
                    self.received += [f for f in inbound.feed(data)
                                      if not isinstance(f, spdy.DataFrame)]  # fmt: skip
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()

    async def send(self, *frames: spdy.Frame | bytes) -> bool:
        """Write frames (or raw bytes); False once the server has hung up."""
        if self.closed.is_set():
            return False
        try:
            self.writer.write(b"".join(f if isinstance(f, bytes) else self.codec.encode(f)
                                       for f in frames))  # fmt: skip
            await self.writer.drain()
        except (ConnectionError, OSError):
            return False
        return not self.closed.is_set()

    async def wait_closed(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.closed.wait(), timeout)
        return self.closed.is_set()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        await self._stop()

    async def abort(self) -> None:
        """Hang up at once, dropping what the server has not read yet (a flood's backlog
        would take it long to read, and a graceful close waits for that)."""
        self.writer.transport.abort()
        await self._stop()

    async def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def upgrade(url: str, protocols: list[str]) -> Raw:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(request_head(url, protocols))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    if b" 101 " not in head.split(b"\r\n")[0]:
        writer.close()
        raise ConnectionRefusedError(head.decode(errors="replace"))
    raw = Raw(reader, writer)
    raw.start()
    return raw


@dataclass
class RawWs(Raw):
    """One upgraded WebSocket connection driven frame by frame (frames from `ws_frame`);
    `close` is the server's close frame (code, reason), once it sent one."""

    ws: WSConnection = field(default_factory=lambda: WSConnection(ConnectionType.CLIENT))
    close_frame: tuple[int, str] | None = None

    async def _drain(self) -> None:
        try:
            while data := await self.reader.read(1 << 16):
                self.ws.receive_data(data)
                for event in self.ws.events():
                    if isinstance(event, CloseConnection) and self.close_frame is None:
                        self.close_frame = (event.code, event.reason or "")
        except Exception:  # a reset, or wsproto on what follows the close frame
            pass
        finally:
            self.closed.set()


# WebSocket opcodes (RFC 6455 section 5.2).
WS_TEXT, WS_BINARY, WS_PING, WS_PONG = 0x1, 0x2, 0x9, 0xA


def ws_frame(opcode: int, payload: bytes = b"", mask: bytes = b"\x5a\xa5\x3c\xc3") -> bytes:
    """One final client frame, masked as a client must (payloads under 64 KiB)."""
    size = len(payload)
    head = bytes([0x80 | opcode]) + (bytes([0x80 | size]) if size < 126
                                      else bytes([0x80 | 126]) + struct.pack(">H", size))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def upgrade_ws(url: str, protocols: list[str]) -> RawWs:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    ws = WSConnection(ConnectionType.CLIENT)
    writer.write(ws.send(Request(host=parts.netloc, target=parts.path, subprotocols=protocols)))
    while True:
        data = await asyncio.wait_for(reader.read(1 << 16), 10)
        if not data:
            raise ConnectionRefusedError("server hung up during the WebSocket handshake")
        ws.receive_data(data)
        if any(isinstance(e, AcceptConnection) for e in ws.events()):
            break
    raw = RawWs(reader, writer, ws=ws)
    raw.start()
    return raw


@dataclass
class Flood:
    """The same bytes (`unit`, one or a few frames) sent over and over on `raw`; `sent`
    counts the units the server has taken so far (written and drained)."""

    raw: Raw
    unit: bytes
    sent: int = 0

    async def run(self, count: int, batch: int = 4096) -> None:
        """Send `unit` `count` times in writes of `batch` units, until the server hangs up
        (callers bound the time: a server that stops reading holds this in drain)."""
        block = self.unit * batch
        while self.sent < count:
            n = min(batch, count - self.sent)
            if not await self.raw.send(block if n == batch else self.unit * n):
                return
            self.sent += n


def cpu_seconds(pid: int) -> float:
    """The CPU time the process used so far (user + system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def taken(pid: int, floods: list[Flood], seconds: float, still: float = 1.0) -> None:
    """Wait until the server `pid` has stopped taking from `floods`: for `still` seconds
    no unit was taken and it used under a tenth of a CPU (it is not still parsing what
    it read), or every flood is done; at most `seconds`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        sent, cpu = sum(f.sent for f in floods), cpu_seconds(pid)
        await asyncio.sleep(still)
        if sum(f.sent for f in floods) == sent and cpu_seconds(pid) - cpu < still / 10:
            return


async def open_channels(raw: Raw, kinds: list[str]) -> int:
    """Open the exec channels an honest client would; returns the next stream id."""
    sid = 1
    for kind in kinds:
        await raw.send(spdy.SynStream(sid, {"streamtype": [kind]}))
        sid += 2
    return sid


async def syn_flood(url: str, count: int, *, fin: bool, unidirectional: bool,
                    channels: list[str], batch: int = 500) -> Raw:  # fmt: skip
    """After the channels, `count` more SYN_STREAMs; stops once the server hangs up."""
    raw = await upgrade(url, ["v4.channel.k8s.io"])
    sid = await open_channels(raw, channels)
    for start in range(0, count, batch):
        frames = [spdy.SynStream(sid + 2 * k, {"streamtype": [f"x{start + k}"]}, fin=fin,
                                 unidirectional=unidirectional)
                  for k in range(min(batch, count - start))]  # fmt: skip
        sid += 2 * len(frames)
        if not await raw.send(*frames):
            break
    return raw


async def data_flood(url: str, streams: int, frames: int, size: int, *, channels: list[str],
                     budget: float) -> tuple[Raw, int]:  # fmt: skip
    """Open `streams` extra streams and send `frames` data frames of `size` bytes on
    each, for at most `budget` seconds; returns the bytes the server took."""
    raw = await upgrade(url, ["v4.channel.k8s.io"])
    sid = await open_channels(raw, channels)
    ids = [sid + 2 * k for k in range(streams)]
    for i in ids:
        await raw.send(spdy.SynStream(i, {"streamtype": [f"extra{i}"]}))
    chunk = b"z" * size
    sent = 0

    async def pump() -> None:
        nonlocal sent
        for _ in range(frames):
            for i in ids:
                if not await raw.send(spdy.DataFrame(i, chunk)):
                    return
                sent += size

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(pump(), budget)
    return raw, sent


async def pair_flood(url: str, port: int, pairs: int, *, reset: bool = False,
                     batch: int = 100) -> Raw:  # fmt: skip
    """Port-forward: `pairs` error+data stream pairs, each opened FIN|UNIDIRECTIONAL
    (done both ways at once, so the session holds nothing for it), or then reset."""
    raw = await upgrade(url, ["portforward.k8s.io"])
    sid = 1
    for start in range(0, pairs, batch):
        frames: list[spdy.Frame | bytes] = []
        for k in range(start, min(pairs, start + batch)):
            h = {"port": [str(port)], "requestid": [str(k)]}
            frames += [spdy.SynStream(sid, {**h, "streamtype": ["error"]}, fin=True,
                                      unidirectional=True),
                       spdy.SynStream(sid + 2, {**h, "streamtype": ["data"]}, fin=True,
                                      unidirectional=True)]
            if reset:
                frames += [spdy.RstStream(sid), spdy.RstStream(sid + 2)]
            sid += 4
        if not await raw.send(*frames):
            break
    return raw


def idle_flood(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` TCP connections that never send a byte (connects not waited for)."""
    socks = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex((host, port))
        socks.append(s)
    return socks


async def dribble(url: str, interval: float, limit: float) -> float | None:
    """Slowloris: send a request head one byte every `interval` seconds; how long the
    server took to hang up (None if it still had not after `limit` seconds)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    head = request_head(url, ["v4.channel.k8s.io"])
    start = time.monotonic()
    eof = asyncio.create_task(reader.read())
    try:
        for byte in head[:-1]:
            if eof.done() or time.monotonic() - start > limit:
                break
            with contextlib.suppress(ConnectionError, OSError):
                writer.write(bytes([byte]))
                await writer.drain()
            await asyncio.wait([eof], timeout=interval)
        left = max(0.0, limit - (time.monotonic() - start))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(eof), left)
        return time.monotonic() - start if eof.done() else None
    finally:
        eof.cancel()
        writer.close()


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port
