"""A small SPDY/3.1 streaming client built on pycri's own framing, so CI (which has no
crictl) still drives exec, attach and port-forward end to end over real sockets."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from pycri.streaming.session import Session, Stream


async def upgrade(url: str, protocols: list[str]) -> tuple[Session, str]:
    """POST the upgrade request; returns the client session and the negotiated protocol."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    lines = [f"POST {parts.path} HTTP/1.1", f"Host: {parts.netloc}",
             "Connection: Upgrade", "Upgrade: SPDY/3.1", "Content-Length: 0"]
    lines += [f"X-Stream-Protocol-Version: {p}" for p in protocols]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    status = int(head.split(" ")[1])
    if status != 101:
        body = await reader.read()
        writer.close()
        raise ConnectionRefusedError(f"upgrade refused: {status} {body.decode().strip()}")
    negotiated = ""
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.lower() == "x-stream-protocol-version":
            negotiated = value.strip()
    session = Session(reader, writer, server=False)
    session.start()
    return session, negotiated


@dataclass
class Outcome:
    stdout: bytes
    stderr: bytes
    error: bytes  # what the server wrote on the error stream
    protocol: str

    @property
    def status(self) -> dict[str, object]:
        return json.loads(self.error)


async def run(
    url: str,
    *,
    stdin: bytes | None = None,
    tty: bool = False,
    stderr: bool = True,
    resize: tuple[int, int] | None = None,
    protocols: tuple[str, ...] = ("v4.channel.k8s.io",),
    close_stdin: bool = True,
    timeout: float = 30.0,
) -> Outcome:
    """Open the channels like client-go does, feed stdin, collect everything until the end."""
    session, proto = await upgrade(url, list(protocols))
    try:
        streams: dict[str, Stream] = {}
        kinds = ["error"] + (["stdin"] if stdin is not None else []) + ["stdout"]
        if stderr and not tty:
            kinds.append("stderr")
        if tty:
            kinds.append("resize")
        for kind in kinds:
            streams[kind] = await session.open({"streamtype": [kind]})
        if "resize" in streams and resize is not None:
            await streams["resize"].write(
                json.dumps({"Width": resize[0], "Height": resize[1]}).encode() + b"\n")
        if stdin is not None:
            await streams["stdin"].write(stdin)
            if close_stdin:
                await streams["stdin"].close()
        readers = [streams["stdout"].read_all(), streams["error"].read_all()]
        if "stderr" in streams:
            readers.append(streams["stderr"].read_all())
        results = await asyncio.wait_for(asyncio.gather(*readers), timeout)
        return Outcome(results[0], results[2] if len(results) > 2 else b"", results[1], proto)
    finally:
        await session.close(linger=1.0)


async def forward_once(url: str, port: int, payload: bytes, timeout: float = 30.0
                       ) -> tuple[bytes, bytes]:
    """One forwarded connection: send `payload`, half-close, read the reply and the error."""
    session, _ = await upgrade(url, ["portforward.k8s.io"])
    return await forward_over(session, port, payload, timeout)


async def forward_over(session: Session, port: int, payload: bytes, timeout: float = 30.0
                       ) -> tuple[bytes, bytes]:  # fmt: skip
    """forward_once over a session already upgraded (SPDY, or SPDY in a WebSocket tunnel)."""
    try:
        headers = {"port": [str(port)], "requestid": ["0"]}
        error = await session.open({**headers, "streamtype": ["error"]})
        await error.close()
        data = await session.open({**headers, "streamtype": ["data"]})
        await data.write(payload)
        await data.close()
        reply = await asyncio.wait_for(data.read_all(), timeout)
        await data.reset()
        message = await asyncio.wait_for(error.read_all(), timeout)
        return reply, message
    finally:
        await session.close(linger=1.0)
