"""The exec/attach protocol (`*.channel.k8s.io`), over a SPDY session or a WebSocket.

The transports differ only in how the channels are opened (`serve_spdy`,
`serve_websocket`); `serve` runs the command over them. Over SPDY the client opens
one stream per channel, naming it in the `streamType` header: `error`, `stdin`,
`stdout`, `stderr` (not with a tty) and, from v3 on with a tty, `resize` (JSON
`{"Width":w,"Height":h}` objects, one after another). When the command ends, the
server writes the outcome on the error stream and closes every stream. v1/v2/v3
write a failure as plain text (nothing on success); v4 always writes a JSON
metav1.Status, and a non-zero exit is a Failure with reason
`NonZeroExitCode` whose cause `ExitCode` carries the code (that is how client-go
turns it into an exit code). Over WebSocket the channels are numbered and always
there (pycri.streaming.websocket); v4 and v5 write the same JSON Status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pycri.errors import PycriError
from pycri.streaming import websocket
from pycri.streaming.session import Session, Stream

log = logging.getLogger(__name__)

V1, V2, V3, V4 = "channel.k8s.io", "v2.channel.k8s.io", "v3.channel.k8s.io", "v4.channel.k8s.io"
V5 = "v5.channel.k8s.io"
PROTOCOLS = [V4, V3, V2, V1]
# WebSocket sub-protocols and the version whose rules (status format, close signal) they
# follow; "" is a client that offered none. kubelet's set, plus v2/v3 (client-go knows them).
WEBSOCKET_PROTOCOLS = {
    V5: V5, "v5.base64.channel.k8s.io": V5,
    V4: V4, "v4.base64.channel.k8s.io": V4,
    V3: V3, V2: V2,
    V1: V1, "base64.channel.k8s.io": V1, "": V1,
}  # fmt: skip
# Channel numbers of the WebSocket framing.
STDIN, STDOUT, STDERR, ERROR, RESIZE = range(5)
STREAM_TIMEOUT = 30.0
CHANNELS = ("error", "stdin", "stdout", "stderr", "resize")


class ByteReader(Protocol):
    async def read(self) -> bytes: ...  # b"" at end of input


class ByteWriter(Protocol):
    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class TerminalSize:
    width: int
    height: int


@dataclass(frozen=True)
class Options:
    """Which channels the request asked for (the client opens the same ones)."""

    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


# Terminal sizes parsed and not yet applied: past them the resize channel is not read,
# and its input waits in its bounded buffer (a flood of sizes is not queued for ever).
MAX_PENDING_RESIZES = 16


@dataclass
class StreamIO:
    """What an exec or attach backend sees: the channels, independent of the transport."""

    tty: bool
    stdin: ByteReader | None = None
    stdout: ByteWriter | None = None
    stderr: ByteWriter | None = None
    resizes: asyncio.Queue[TerminalSize] = field(
        default_factory=lambda: asyncio.Queue(MAX_PENDING_RESIZES))


Handler = Callable[[StreamIO], Awaitable[int]]
"""Runs the command or attach session over the channels; returns the exit code."""


def status_body(version: str, exit_code: int | None, error: str | None) -> bytes:
    """What goes on the error stream for this outcome under protocol `version`."""
    if version in (V4, V5):
        status: dict[str, Any] = {"metadata": {}, "status": "Success"}
        if error is not None:
            status = {"metadata": {}, "status": "Failure", "message": error,
                      "reason": "InternalError", "code": 500}  # fmt: skip
        elif exit_code:
            status = {
                "metadata": {},
                "status": "Failure",
                "message": f"command terminated with non-zero exit code: exit status {exit_code}",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(exit_code)}]},
            }
        return json.dumps(status).encode()
    if error is not None:
        return error.encode()
    if exit_code:
        return f"command terminated with non-zero exit code: exit status {exit_code}".encode()
    return b""


def parse_sizes(buf: bytearray) -> list[TerminalSize]:
    """Take every complete JSON size object off the front of `buf` (the rest stays)."""
    text = buf.decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    out: list[TerminalSize] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except ValueError:
            break  # incomplete: wait for more
        if isinstance(obj, dict):
            try:
                w, h = int(obj.get("Width") or 0), int(obj.get("Height") or 0)
            except (TypeError, ValueError, OverflowError):
                continue  # a malformed size is ignored, not fatal to the session
            if 0 < w < 1 << 16 and 0 < h < 1 << 16:
                out.append(TerminalSize(w, h))
    del buf[: len(text[:pos].encode())]
    return out


MAX_RESIZE_BACKLOG = 4096


async def _pump_resizes(stream: ByteReader, queue: asyncio.Queue[TerminalSize]) -> None:
    buf = bytearray()
    while chunk := await stream.read():
        buf += chunk
        for size in parse_sizes(buf):
            await queue.put(size)
        if len(buf) > MAX_RESIZE_BACKLOG:  # no size message is this long: drop the garbage
            buf.clear()


@dataclass
class Channels:
    """The open channels of one exec/attach, whichever transport carries them."""

    error: ByteWriter
    stdin: ByteReader | None = None
    stdout: ByteWriter | None = None
    stderr: ByteWriter | None = None
    resize: ByteReader | None = None


async def serve(channels: Channels, version: str, tty: bool, handler: Handler) -> None:
    """Run one exec/attach over `channels` and report its outcome on the error channel
    (the transport closes the channels afterwards)."""
    io = StreamIO(tty=tty, stdin=channels.stdin, stdout=channels.stdout,
                  stderr=channels.stderr if not tty else None)  # fmt: skip
    resizer = None
    if tty and channels.resize is not None:
        resizer = asyncio.create_task(_pump_resizes(channels.resize, io.resizes))
    code: int | None = None
    error: str | None = None
    try:
        code = await handler(io)
    except PycriError as e:
        error = str(e)
    except Exception as e:
        log.exception("streaming command failed")
        error = f"{type(e).__name__}: {e}"
    finally:
        if resizer is not None:
            resizer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await resizer
    body = status_body(version, code, error)
    if body:
        await channels.error.write(body)


async def _collect(session: Session, wanted: set[str]) -> dict[str, Stream]:
    """Accept streams until every wanted channel is open; extra known channels are kept
    too (at most one each), anything else is reset."""
    got: dict[str, Stream] = {}
    while not wanted <= got.keys():
        stream = await session.accept()
        if stream is None:
            raise ConnectionResetError("client went away before opening its streams")
        kind = stream.header("streamtype")
        if kind in got or kind not in CHANNELS:
            await stream.reset()
            continue
        got[kind] = stream
    return got


async def serve_spdy(session: Session, version: str, opts: Options, handler: Handler,
                     stream_timeout: float = STREAM_TIMEOUT) -> None:  # fmt: skip
    """Run one exec/attach over `session` and report its outcome. Streams opened after
    the channels are left unaccepted: they count against the session's stream bound,
    so a client that keeps opening them has its session closed."""
    wanted = {"error"}
    if opts.stdin:
        wanted.add("stdin")
    if opts.stdout:
        wanted.add("stdout")
    if opts.stderr and not opts.tty:
        wanted.add("stderr")
    if opts.tty and version in (V3, V4):
        wanted.add("resize")
    try:
        streams = await asyncio.wait_for(_collect(session, wanted), stream_timeout)
    except (TimeoutError, ConnectionResetError) as e:
        log.info("streaming session abandoned: %s", e or "timed out waiting for streams")
        return
    channels = Channels(error=streams["error"], stdin=streams.get("stdin"),
                        stdout=streams.get("stdout"), stderr=streams.get("stderr"),
                        resize=streams.get("resize"))  # fmt: skip
    await serve(channels, version, opts.tty, handler)
    for stream in streams.values():
        await stream.close()


async def serve_websocket(conn: websocket.Connection, protocol: str, opts: Options,
                          handler: Handler) -> None:  # fmt: skip
    """Run one exec/attach over the channel framing of `conn` (module docstring of
    pycri.streaming.websocket): the channels exist from the start, so kubelet's empty
    message on the first output channel tells the client they are ready."""
    version = WEBSOCKET_PROTOCOLS[protocol]
    # Only channels something reads take input (a resize without a tty is dropped).
    inputs = ([RESIZE] if opts.tty else []) + ([STDIN] if opts.stdin else [])
    mux = websocket.ChannelMux(conn, protocol, inputs, close_signal=version == V5)
    conn.start(mux)
    channels = Channels(
        error=mux.channel(ERROR),
        stdin=mux.channel(STDIN) if opts.stdin else None,
        stdout=mux.channel(STDOUT) if opts.stdout else None,
        stderr=mux.channel(STDERR) if opts.stderr and not opts.tty else None,
        resize=mux.channel(RESIZE) if opts.tty else None,
    )
    await mux.channel(STDOUT if opts.stdout else STDERR if opts.stderr else ERROR).announce()
    await serve(channels, version, opts.tty, handler)
