"""A small WebSocket streaming client on wsproto over a plain blocking socket, so the
tests drive exec, attach and port-forward over WebSocket without crictl, and can also
send what no honest client does (an oversized message)."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from pycri.streaming import websocket
from pycri.streaming.session import Session
from tests.streaming import client as spdy_client

STDIN, STDOUT, STDERR, ERROR, RESIZE = range(5)
TUNNEL = "SPDY/3.1+portforward.k8s.io"


class Refused(Exception):
    """The server answered the upgrade with an HTTP error."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"upgrade refused: {status} {body.decode(errors='replace').strip()}")
        self.status = status


@dataclass
class Closed:
    code: int
    reason: str


@dataclass
class Client:
    sock: socket.socket
    ws: WSConnection
    protocol: str  # negotiated; "" when the server chose none
    closed: Closed | None = None

    @property
    def base64(self) -> bool:
        return "base64." in self.protocol

    def send_raw(self, data: bytes | str) -> None:
        self.sock.sendall(self.ws.send(TextMessage(data) if isinstance(data, str)
                                       else BytesMessage(data)))  # fmt: skip

    def send(self, channel: int, data: bytes) -> None:
        if self.base64:
            self.send_raw(chr(ord("0") + channel) + base64.b64encode(data).decode())
        else:
            self.send_raw(bytes([channel]) + data)

    def close_channel(self, channel: int) -> None:
        """v5's close signal."""
        self.send_raw(bytes([255, channel]))

    def messages(self, timeout: float = 30.0) -> list[tuple[int, bytes]]:
        """Every (channel, payload) until the server closes; `closed` says how."""
        out: list[tuple[int, bytes]] = []
        buf = b""
        deadline = time.monotonic() + timeout
        while self.closed is None:
            self.sock.settimeout(max(0.1, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            if time.monotonic() > deadline:
                raise TimeoutError("server did not close the connection")
            self.ws.receive_data(data or None)
            for event in self.ws.events():
                if isinstance(event, Message):
                    buf += event.data.encode() if isinstance(event.data, str) else event.data
                    if event.message_finished:
                        raw, buf = buf, b""
                        if raw:
                            if self.base64:
                                out.append((raw[0] - ord("0"), base64.b64decode(raw[1:])))
                            else:
                                out.append((raw[0], raw[1:]))
                elif isinstance(event, Ping):
                    self.sock.sendall(self.ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    self.closed = Closed(event.code, event.reason or "")
                    if self.ws.state.name == "REMOTE_CLOSING":
                        self.sock.sendall(self.ws.send(event.response()))
            if not data and self.closed is None:
                self.closed = Closed(1006, "connection lost")
        return out

    def close(self) -> None:
        self.sock.close()


def connect(url: str, protocols: list[str], *, path: str | None = None) -> Client:
    """Upgrade to WebSocket at `url` offering `protocols`; Refused on an HTTP error."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    ws = WSConnection(ConnectionType.CLIENT)
    target = path if path is not None else parts.path + (f"?{parts.query}" if parts.query else "")
    sock.sendall(ws.send(Request(host=parts.netloc, target=target, subprotocols=protocols)))
    status, body = 0, b""
    while True:
        data = sock.recv(65536)
        ws.receive_data(data or None)
        for event in ws.events():
            if isinstance(event, AcceptConnection):
                return Client(sock, ws, event.subprotocol or "")
            if isinstance(event, RejectConnection):
                status = event.status_code
                if not event.has_body:
                    sock.close()
                    raise Refused(status, b"")
            elif isinstance(event, RejectData):
                body += event.data
                if event.body_finished:
                    sock.close()
                    raise Refused(status, body)
        if not data:
            sock.close()
            raise Refused(status, body)


@dataclass
class Outcome:
    stdout: bytes
    stderr: bytes
    error: bytes
    protocol: str
    closed: Closed
    first: int  # the channel of the server's first message (its "ready")

    @property
    def status(self) -> dict[str, object]:
        return json.loads(self.error)


def run(url: str, *, protocols: tuple[str, ...] = ("v5.channel.k8s.io",),
        stdin: bytes | None = None, close_stdin: bool = True,
        resize: tuple[int, int] | None = None, timeout: float = 30.0) -> Outcome:  # fmt: skip
    """Exec or attach: send stdin (then v5's close signal), collect until the server closes."""
    client = connect(url, list(protocols))
    try:
        if resize is not None:
            client.send(RESIZE, json.dumps({"Width": resize[0], "Height": resize[1]}).encode())
        if stdin:
            client.send(STDIN, stdin)
        if stdin is not None and close_stdin:
            client.close_channel(STDIN)
        got = client.messages(timeout)
        assert client.closed is not None
        def joined(channel: int) -> bytes:
            return b"".join(payload for ch, payload in got if ch == channel)

        return Outcome(joined(STDOUT), joined(STDERR), joined(ERROR), client.protocol,
                       client.closed, got[0][0] if got else -1)  # fmt: skip
    finally:
        client.close()


async def tunnel_forward_once(url: str, port: int, payload: bytes) -> tuple[bytes, bytes]:
    """client-go's port-forward over WebSocket: a SPDY session inside binary messages
    (the framing and tunnel are pycri's own, run as the client; crictl tests it for real)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    ws = WSConnection(ConnectionType.CLIENT)
    writer.write(ws.send(Request(host=parts.netloc, target=parts.path, subprotocols=[TUNNEL])))
    accepted = None
    while accepted is None:
        data = await reader.read(65536)
        assert data, "server hung up during the handshake"
        ws.receive_data(data)
        accepted = next((e for e in ws.events() if isinstance(e, AcceptConnection)), None)
    assert accepted.subprotocol == TUNNEL
    conn = websocket.Connection(reader, writer, ws)
    tunnel = websocket.Tunnel(conn)
    conn.start(tunnel)
    session = Session(tunnel, tunnel, server=False)
    session.start()
    try:
        return await spdy_client.forward_over(session, port, payload)
    finally:
        await conn.close(linger=1.0)
