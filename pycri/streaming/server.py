"""The streaming server: one-time URLs for Exec/Attach/PortForward, and the upgrades behind them.

The CRI RPCs only validate a request and return `http://<addr>/<kind>/<token>`;
the client then connects there and upgrades to SPDY/3.1. A token is good for one
connection within TOKEN_TTL seconds, so a URL cannot be replayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Protocol

from pycri.errors import InvalidArgument
from pycri.streaming import http, portforward, remotecommand
from pycri.streaming.remotecommand import StreamIO
from pycri.streaming.session import Session

log = logging.getLogger(__name__)

TOKEN_TTL = 60.0
MAX_TOKENS = 1000


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


class StreamingServer:
    def __init__(self, address: str, backend: Backend, token_ttl: float = TOKEN_TTL) -> None:
        self.host, self.port = parse_address(address)
        self.backend = backend
        self.token_ttl = token_ttl
        self._tokens: dict[str, tuple[float, Request]] = {}
        self._server: asyncio.Server | None = None
        self._sessions: set[asyncio.Task[None]] = set()

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("streaming server on %s", self.base_url)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._sessions.add(task)
        try:
            await self._handle(reader, writer)
        except Exception:
            log.exception("streaming connection failed")
        finally:
            self._sessions.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _reply(self, writer: asyncio.StreamWriter, status: int, reason: str,
                     message: str, headers: dict[str, str] | None = None) -> None:  # fmt: skip
        writer.write(http.response(status, reason, headers or {}, (message + "\n").encode()))
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await http.read_request(reader)
        except (http.BadRequest, TimeoutError) as e:
            await self._reply(writer, 400, "Bad Request", str(e) or "request head timed out")
            return
        parts = request.path.strip("/").split("/")
        req = self._redeem(parts[0], parts[1]) if len(parts) == 2 else None
        if req is None:
            await self._reply(writer, 404, "Not Found", "unknown or expired streaming URL")
            return
        if request.upgrade() != "spdy/3.1":
            await self._reply(writer, 400, "Bad Request",
                              "this endpoint needs an upgrade to SPDY/3.1")  # fmt: skip
            return
        supported = [portforward.PROTOCOL] if isinstance(req, PortForwardRequest) else (
            remotecommand.PROTOCOLS)
        version = http.negotiate(request.values(http.PROTOCOL_HEADER), supported)
        if version is None:
            await self._reply(writer, 403, "Forbidden", "no common stream protocol version",
                              {http.ACCEPTED_HEADER: ", ".join(supported)})
            return
        headers = {"Connection": "Upgrade", "Upgrade": "SPDY/3.1"}
        if version:
            headers["X-Stream-Protocol-Version"] = version
        writer.write(http.response(101, "Switching Protocols", headers))
        await writer.drain()
        session = Session(reader, writer, server=True)
        session.start()
        try:
            await self._run(session, req, version or remotecommand.V1)
        finally:
            await session.close()

    async def _run(self, session: Session, req: Request, version: str) -> None:
        if isinstance(req, PortForwardRequest):
            sid = req.sandbox_id
            await portforward.serve_spdy(session, lambda port: self.backend.dial(sid, port))
            return
        opts = remotecommand.Options(stdin=req.stdin, stdout=req.stdout, stderr=req.stderr,
                                     tty=req.tty)  # fmt: skip
        if isinstance(req, ExecRequest):
            exec_req = req
            await remotecommand.serve_spdy(session, version, opts,
                                           lambda io: self.backend.exec(exec_req, io))
        else:
            attach_req = req
            await remotecommand.serve_spdy(session, version, opts,
                                           lambda io: self.backend.attach(attach_req, io))
