"""The streaming server: one-time URLs for Exec/Attach/PortForward, and the upgrades behind them.

The CRI RPCs only validate a request and return `http://<addr>/<kind>/<token>`;
the client then connects there and upgrades to SPDY/3.1 or WebSocket (the request's
`Upgrade` header picks; the exec/attach/port-forward code behind is the same). A
token is good for one connection within TOKEN_TTL seconds, so a URL cannot be replayed.

The port is open to anyone until a request names a token, so the server bounds
what connections can hold (pycri.config.StreamingConfig): connections in all,
connections still sending their request head (in all and per peer address, each
given `header_timeout` seconds), and file descriptors. At a bound it stops
accepting, so excess connections wait in the kernel's backlog instead of costing
fds, and the daemon keeps the fds its CRI socket needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import secrets
import socket
import time
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from wsproto import WSConnection
from wsproto.events import AcceptConnection
from wsproto.events import Request as WsRequest
from wsproto.utilities import RemoteProtocolError

from pycri import malloc
from pycri.config import StreamingConfig
from pycri.errors import InvalidArgument, ResourceExhausted
from pycri.streaming import http, portforward, remotecommand, websocket
from pycri.streaming.inbox import Pool
from pycri.streaming.limits import Budget, RateLimitedLog, fd_budget
from pycri.streaming.remotecommand import StreamIO
from pycri.streaming.session import Reader, Session, Writer

log = logging.getLogger(__name__)

TOKEN_TTL = 60.0
MAX_TOKENS = 1000
# accept(2) errors that mean "out of fds or memory": wait and retry, never spin.
_RESOURCE_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
ACCEPT_RETRY = 0.5
# How often a full server looks again whether reads made room for new connections.
ROOM_RECHECK = 0.2
# Unread input given back since the last trim that makes the next one worth it.
RELEASE_AT = 8 << 20
TRIM_DELAY = 0.2
# File descriptors an exec or attach holds besides its connection (pipes or a terminal,
# a pidfd, the runtime's or conmon's sockets), counted against the same budget.
PROCESS_FDS = 8


@dataclass(frozen=True)
class ExecRequest:
    container_id: str
    cmd: list[str]
    tty: bool
    stdin: bool
    stdout: bool
    stderr: bool


@dataclass(frozen=True)
class AttachRequest:
    container_id: str
    tty: bool
    stdin: bool
    stdout: bool
    stderr: bool


@dataclass(frozen=True)
class PortForwardRequest:
    sandbox_id: str
    ports: list[int]


Request = ExecRequest | AttachRequest | PortForwardRequest


@dataclass
class Upgraded:
    """A request whose connection switched protocols: SPDY, or WebSocket (`ws` set)."""

    req: Request
    version: str  # the negotiated (sub-)protocol; "" when the client offered none
    ws: WSConnection | None


class Backend(Protocol):
    """What the streaming server needs from the runtime (pycri.streaming.backend)."""

    def check_exec(self, req: ExecRequest) -> ExecRequest: ...

    def check_attach(self, req: AttachRequest) -> AttachRequest: ...

    def check_port_forward(self, req: PortForwardRequest) -> PortForwardRequest: ...

    async def exec(self, req: ExecRequest, io: StreamIO) -> int: ...

    async def attach(self, req: AttachRequest, io: StreamIO) -> int: ...

    async def dial(self, sandbox_id: str, port: int) -> socket.socket: ...


def parse_address(address: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" (port 0: any free port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InvalidArgument(f"streaming_address {address!r} is not host:port")
    host = host.removeprefix("[").removesuffix("]")
    return host, int(port)


class _Unread(Pool):
    """All sessions' unread input. Once RELEASE_AT of it was given back since the last
    time, the freed heap goes back to the kernel (glibc keeps it otherwise, and a
    flood's high-water mark stayed the daemon's resident size after it ended): TRIM_DELAY
    later, so that a session's end gives back all it held first."""

    _trim_pending = False
    peak = 0  # the most it held since the last trim

    def take(self, size: int) -> None:
        super().take(size)
        self.peak = max(self.peak, self.used)

    def give(self, size: int) -> None:
        super().give(size)
        if self.peak - self.used >= RELEASE_AT and not self._trim_pending:
            self._trim_pending = True
            asyncio.get_running_loop().call_later(TRIM_DELAY, self._trim)

    def _trim(self) -> None:
        self._trim_pending = False
        self.peak = self.used
        asyncio.get_running_loop().run_in_executor(None, malloc.release)


class StreamingServer:
    def __init__(self, address: str, backend: Backend, token_ttl: float = TOKEN_TTL,
                 limits: StreamingConfig | None = None) -> None:  # fmt: skip
        self.host, self.port = parse_address(address)
        self.backend = backend
        self.token_ttl = token_ttl
        self.limits = limits or StreamingConfig()
        self.fds = Budget(self.limits.max_fds)
        # Every session's unread input together (inbox.py): the daemon-wide bound.
        self.buffered = _Unread(self.limits.max_buffer_total)
        self._tokens: dict[str, tuple[float, Request]] = {}
        self._listener: socket.socket | None = None
        self._acceptor: asyncio.Task[None] | None = None
        self._sessions: set[asyncio.Task[None]] = set()
        self._pending: Counter[str] = Counter()  # peer address -> connections before upgrade
        self._room = asyncio.Event()
        self._warn = RateLimitedLog(log)

    def active_sessions(self) -> int:
        """Connections past their upgrade: exec, attach and port-forward sessions."""
        return max(0, len(self._sessions) - sum(self._pending.values()))

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        self.fds = Budget(fd_budget(self.limits.max_fds, self.limits.fd_reserve))
        infos = await asyncio.get_running_loop().getaddrinfo(
            self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        listener = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(addr)
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._acceptor = asyncio.create_task(self._accept_loop(listener))
        log.info("streaming server on %s (up to %d connections, %d fds)", self.base_url,
                 self.limits.max_connections, self.fds.total)  # fmt: skip

    async def stop(self) -> None:
        if self._acceptor is not None:
            self._acceptor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._acceptor
            self._acceptor = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for task in list(self._sessions):
            task.cancel()
        await asyncio.gather(*self._sessions, return_exceptions=True)

    @property
    def base_url(self) -> str:
        host = self.host
        with contextlib.suppress(ValueError):
            ip = ipaddress.ip_address(host)
            if ip.is_unspecified:
                host = "127.0.0.1" if ip.version == 4 else "::1"
            if ip.version == 6 or ":" in host:
                host = f"[{host}]"
        return f"http://{host}:{self.port}"

    # -- URLs ------------------------------------------------------------------------

    def exec_url(self, req: ExecRequest) -> str:
        return self._issue("exec", self.backend.check_exec(req))

    def attach_url(self, req: AttachRequest) -> str:
        return self._issue("attach", self.backend.check_attach(req))

    def port_forward_url(self, req: PortForwardRequest) -> str:
        return self._issue("portforward", self.backend.check_port_forward(req))

    def _issue(self, kind: str, req: Request) -> str:
        if self._spent():
            raise ResourceExhausted(
                f"streaming sessions on this node hold {self.buffered.used} bytes of unread "
                f"input, their budget (streaming.max_buffer_total); try again later")
        now = time.monotonic()
        for token, (expiry, _) in list(self._tokens.items()):
            if expiry < now:
                del self._tokens[token]
        if len(self._tokens) >= MAX_TOKENS:
            raise InvalidArgument("too many pending streaming requests; try again later")
        token = secrets.token_urlsafe(12)
        self._tokens[token] = (now + self.token_ttl, req)
        return f"{self.base_url}/{kind}/{token}"

    def _redeem(self, kind: str, token: str) -> Request | None:
        entry = self._tokens.pop(token, None)
        if entry is None or entry[0] < time.monotonic():
            return None
        req = entry[1]
        expected = {"exec": ExecRequest, "attach": AttachRequest,
                    "portforward": PortForwardRequest}.get(kind)  # fmt: skip
        return req if expected is not None and isinstance(req, expected) else None

    # -- connections -----------------------------------------------------------------

    def _full(self) -> str | None:
        """Which bound stops us accepting now, if any."""
        if len(self._sessions) >= self.limits.max_connections:
            return f"{self.limits.max_connections} connections"
        if self._pending.total() >= self.limits.max_pending:
            return f"{self.limits.max_pending} connections without a request"
        if self.fds.free < 1:
            return f"{self.fds.total} file descriptors"
        if self._spent():
            return f"{self.buffered.limit} bytes of unread input"
        return None

    def _spent(self) -> bool:
        """Whether the sessions together hold their whole budget of unread input."""
        return self.buffered.used >= self.buffered.limit

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while (bound := self._full()) is not None:
                self._warn.warning("full", f"streaming server at its bound of {bound}; "
                                   "new connections wait until one ends")  # fmt: skip
                self._room.clear()
                # Unread input is given back by reads, not only by ends: looked at again.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), ROOM_RECHECK)
            try:
                conn, peer = await loop.sock_accept(listener)
            except OSError as e:
                if e.errno in _RESOURCE_ERRORS:
                    self._warn.warning("accept", f"streaming server cannot accept: {e}")
                    await asyncio.sleep(ACCEPT_RETRY)
                else:  # the client gave up before we took it (ECONNABORTED and the like)
                    log.debug("streaming accept failed: %s", e)
                continue
            host = str(peer[0]) if isinstance(peer, tuple) else ""
            if self._pending[host] >= self.limits.max_pending_per_peer:
                self._warn.warning("peer", f"streaming connection from {host} dropped: it "
                                   f"has {self._pending[host]} without a request already")
                conn.close()
                continue
            self.fds.take()
            self._pending[host] += 1
            task = asyncio.create_task(self._serve(conn, host))
            self._sessions.add(task)

    def _release(self, host: str | None) -> None:
        if host is not None:
            self._pending[host] -= 1
            if self._pending[host] <= 0:
                del self._pending[host]
        self._room.set()

    async def _serve(self, conn: socket.socket, host: str) -> None:
        task = asyncio.current_task()
        assert task is not None
        pending: str | None = host
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_connection(sock=conn)
            upgraded = await self._upgrade(reader, writer)
            if upgraded is not None:
                self._release(pending)
                pending = None
                await self._handle(reader, writer, upgraded)
        except Exception:
            log.exception("streaming connection failed")
        finally:
            if writer is None:
                conn.close()
            else:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
            self._sessions.discard(task)
            self.fds.give()
            self._release(pending)

    async def _reply(self, writer: asyncio.StreamWriter, status: int, reason: str,
                     message: str, headers: dict[str, str] | None = None) -> None:  # fmt: skip
        writer.write(http.response(status, reason, headers or {}, (message + "\n").encode()))
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def _upgrade(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                       ) -> Upgraded | None:  # fmt: skip
        """Read the request head and switch protocols; None when refused (and answered)."""
        try:
            request = await http.read_request(reader, self.limits.header_timeout)
        except (http.BadRequest, TimeoutError) as e:
            await self._reply(writer, 400, "Bad Request", str(e) or "request head timed out")
            return None
        parts = request.path.strip("/").split("/")
        req = self._redeem(parts[0], parts[1]) if len(parts) == 2 else None
        if req is None:
            await self._reply(writer, 404, "Not Found", "unknown or expired streaming URL")
            return None
        pf = isinstance(req, PortForwardRequest)
        negotiated: tuple[str, WSConnection | None] | None
        if request.upgrade() == "websocket":
            negotiated = await self._negotiate_websocket(request, writer, req)
        elif request.upgrade() == "spdy/3.1":
            negotiated = await self._negotiate_spdy(request, writer, pf)
        else:
            await self._reply(writer, 400, "Bad Request", "this endpoint needs an upgrade "
                              "to SPDY/3.1 or WebSocket")  # fmt: skip
            return None
        if negotiated is None:
            return None
        up = Upgraded(req, *negotiated)
        if not pf and not self.fds.take(PROCESS_FDS):
            await self._reply(writer, 503, "Service Unavailable", "too many streaming "
                              "sessions on this node; try again later")  # fmt: skip
            return None
        try:
            if up.ws is not None:
                writer.write(up.ws.send(AcceptConnection(subprotocol=up.version or None)))
            else:
                headers = {"Connection": "Upgrade", "Upgrade": "SPDY/3.1"}
                if up.version:
                    headers["X-Stream-Protocol-Version"] = up.version
                writer.write(http.response(101, "Switching Protocols", headers))
            await writer.drain()
        except BaseException:
            if not pf:
                self.fds.give(PROCESS_FDS)  # _handle, which gives it back, never runs
            raise
        if up.ws is None and not up.version:
            up.version = remotecommand.V1
        return up

    async def _negotiate_spdy(self, request: http.Request, writer: asyncio.StreamWriter,
                              pf: bool) -> tuple[str, WSConnection | None] | None:  # fmt: skip
        supported = [portforward.PROTOCOL] if pf else remotecommand.PROTOCOLS
        version = http.negotiate(request.values(http.PROTOCOL_HEADER), supported)
        if version is None:
            await self._reply(writer, 403, "Forbidden", "no common stream protocol version",
                              {http.ACCEPTED_HEADER: ", ".join(supported)})
            return None
        return version, None

    async def _negotiate_websocket(self, request: http.Request, writer: asyncio.StreamWriter,
                                   req: Request
                                   ) -> tuple[str, WSConnection | None] | None:  # fmt: skip
        """wsproto checks the handshake (GET, key, version 13); the first sub-protocol
        the client offers that this endpoint speaks wins, as in kubelet."""
        ws = websocket.server()
        try:
            ws.receive_data(request.raw)
            hello = next((e for e in ws.events() if isinstance(e, WsRequest)), None)
        except RemoteProtocolError as e:
            await self._reply(writer, 400, "Bad Request", f"bad WebSocket handshake: {e}")
            return None
        if hello is None:
            await self._reply(writer, 400, "Bad Request", "bad WebSocket handshake")
            return None
        offered = hello.subprotocols
        pf = isinstance(req, PortForwardRequest)
        supported = portforward.WEBSOCKET_PROTOCOLS if pf else list(
            remotecommand.WEBSOCKET_PROTOCOLS)
        version = http.negotiate(offered, supported)
        if version is None:
            await self._reply(writer, 403, "Forbidden", "no common WebSocket sub-protocol; "
                              f"this endpoint speaks {', '.join(p for p in supported if p)}")
            return None
        if (isinstance(req, PortForwardRequest) and version in portforward.WEBSOCKET_CHANNELS
                and not req.ports):  # fmt: skip
            await self._reply(writer, 400, "Bad Request", "port-forward over WebSocket "
                              "channels forwards the ports of the PortForward request, "
                              "and it named none")  # fmt: skip
            return None
        log.debug("streaming %s over WebSocket (%s)", type(req).__name__, version or "none")
        return version, ws

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      up: Upgraded) -> None:  # fmt: skip
        try:
            if up.ws is not None:
                await self._handle_websocket(reader, writer, up.req, up.version, up.ws)
            else:
                session = self._session(reader, writer)
                try:
                    await self._run(session, up.req, up.version)
                finally:
                    await session.close()
        finally:
            if not isinstance(up.req, PortForwardRequest):
                self.fds.give(PROCESS_FDS)

    def _session(self, reader: Reader, writer: Writer) -> Session:
        session = Session(reader, writer, server=True, max_streams=self.limits.max_streams,
                          max_buffer=self.limits.max_session_buffer,
                          budget=self.buffered)  # fmt: skip
        session.start()
        return session

    async def _handle_websocket(self, reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter, req: Request, protocol: str,
                                ws: WSConnection) -> None:  # fmt: skip
        conn = websocket.Connection(reader, writer, ws, max_buffer=self.limits.max_session_buffer,
                                    budget=self.buffered)
        try:
            if protocol == portforward.WEBSOCKET_TUNNEL:
                tunnel = websocket.Tunnel(conn)
                conn.start(tunnel)
                session = self._session(tunnel, tunnel)
                try:
                    await self._run(session, req, "")
                finally:
                    await session.close()
            elif isinstance(req, PortForwardRequest):
                sid = req.sandbox_id
                await portforward.serve_websocket(conn, protocol, req.ports,
                                                  lambda port: self.backend.dial(sid, port),
                                                  self.fds,
                                                  self.limits.max_port_forward_connections)
            else:
                await remotecommand.serve_websocket(conn, protocol, self._options(req),
                                                    self._handler(req))  # fmt: skip
        finally:
            await conn.close()

    @staticmethod
    def _options(req: ExecRequest | AttachRequest) -> remotecommand.Options:
        return remotecommand.Options(stdin=req.stdin, stdout=req.stdout, stderr=req.stderr,
                                     tty=req.tty)  # fmt: skip

    def _handler(self, req: ExecRequest | AttachRequest) -> remotecommand.Handler:
        if isinstance(req, ExecRequest):
            exec_req = req
            return lambda io: self.backend.exec(exec_req, io)
        attach_req = req
        return lambda io: self.backend.attach(attach_req, io)

    async def _run(self, session: Session, req: Request, version: str) -> None:
        if isinstance(req, PortForwardRequest):
            sid = req.sandbox_id
            await portforward.serve_spdy(session, lambda port: self.backend.dial(sid, port),
                                         self.fds, self.limits.max_port_forward_connections)
            return
        await remotecommand.serve_spdy(session, version, self._options(req), self._handler(req),
                                       self.limits.stream_timeout)  # fmt: skip
