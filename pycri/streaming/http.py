"""The HTTP/1.1 part of the streaming server: one request head, then an upgrade or an error.

Streaming clients send a single request (POST or GET) asking to upgrade the connection
(`Connection: Upgrade`, `Upgrade: SPDY/3.1` or `websocket`) and offer sub-protocol
versions in `X-Stream-Protocol-Version` (SPDY) or `Sec-WebSocket-Protocol` (WebSocket).
Nothing else is served, so this is deliberately not a general HTTP server.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

MAX_HEAD = 64 * 1024
# The whole head must arrive within this, however it is dribbled (slowloris).
HEAD_TIMEOUT = 5.0

PROTOCOL_HEADER = "x-stream-protocol-version"
ACCEPTED_HEADER = "X-Accepted-Stream-Protocol-Versions"


class BadRequest(Exception):
    """The request head is malformed; answered with 400."""


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, list[str]] = field(default_factory=dict)  # names lowercased
    raw: bytes = b""  # the head as received (wsproto validates a WebSocket handshake from it)

    def values(self, name: str) -> list[str]:
        """Every comma-separated value of a header, over all its lines."""
        out: list[str] = []
        for line in self.headers.get(name.lower(), []):
            out += [v.strip() for v in line.split(",") if v.strip()]
        return out

    def first(self, name: str) -> str:
        values = self.headers.get(name.lower())
        return values[0].strip() if values else ""

    def upgrade(self) -> str:
        """The requested upgrade ("spdy/3.1", "websocket"), lowercased; "" if none."""
        if "upgrade" not in (v.lower() for v in self.values("connection")):
            return ""
        return self.first("upgrade").lower()


async def read_request(reader: asyncio.StreamReader, timeout: float = HEAD_TIMEOUT) -> Request:
    """Read one request head (the upgrade requests carry no body)."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except asyncio.LimitOverrunError:
        raise BadRequest("request head too large") from None
    except asyncio.IncompleteReadError:
        raise BadRequest("connection closed before the request head ended") from None
    if len(head) > MAX_HEAD:
        raise BadRequest("request head too large")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"bad request line {lines[0][:100]!r}")
    req = Request(method=parts[0], path=parts[1].split("?", 1)[0], raw=head)
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise BadRequest(f"bad header line {line[:100]!r}")
        req.headers.setdefault(name.strip().lower(), []).append(value.strip())
    return req


def response(status: int, reason: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"]
    if status != 101:
        headers = {**headers, "Content-Length": str(len(body)), "Connection": "close"}
        if body:
            headers.setdefault("Content-Type", "text/plain; charset=utf-8")
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def negotiate(offered: list[str], supported: list[str]) -> str | None:
    """The first offered protocol we support; "" when none was offered (legacy clients);
    None when the offer and ours do not meet."""
    if not offered:
        return ""
    for proto in offered:
        if proto in supported:
            return proto
    return None
