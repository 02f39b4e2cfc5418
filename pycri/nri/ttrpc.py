"""ttrpc, the RPC protocol NRI speaks, written from its protocol definition.

A message is a 10-byte big-endian header (uint32 data length, uint32 stream id,
uint8 type, uint8 flags) followed by at most 4 MiB of data. A request carries a
protobuf `ttrpc.Request` (service, method, payload, timeout), its answer a
`ttrpc.Response` whose `status` is a google.rpc.Status with a gRPC code. Client
streams have odd ids that only grow. Only unary calls exist in NRI, so the
streaming flags and data messages are refused.

`Channel` is both ends on one byte stream: it sends requests and matches their
responses by stream id, and it answers the peer's requests with the handler it was
given. NRI uses one channel per direction (pycri/nri/mux.py), but nothing here
needs to know that.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIBB")
HEADER_LEN = HEADER.size
MAX_MESSAGE = 4 << 20  # ttrpc's messageLengthMax: larger frames are a protocol violation

TYPE_REQUEST = 0x1
TYPE_RESPONSE = 0x2
TYPE_DATA = 0x3
FLAG_REMOTE_CLOSED = 0x1
FLAG_REMOTE_OPEN = 0x2

MAX_INFLIGHT = 64  # requests served at once per channel; more drop the connection


def _wire_messages() -> dict[str, Any]:
    """ttrpc's own envelope messages (request.proto + google.rpc.Status), built at
    import in a private pool so they never clash with another copy of google.rpc.
    Classes made at run time: their fields are unknown to the type checker (Any)."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(any_pb2.DESCRIPTOR.serialized_pb)
    f = descriptor_pb2.FileDescriptorProto(
        name="pycri/ttrpc_wire.proto", package="ttrpc", syntax="proto3",
        dependency=["google/protobuf/any.proto"])
    T = descriptor_pb2.FieldDescriptorProto

    def msg(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, tname in fields:
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if tname:
                fd.type_name = tname

    opt, rep = T.LABEL_OPTIONAL, T.LABEL_REPEATED
    msg("KeyValue", ("key", 1, T.TYPE_STRING, opt, ""), ("value", 2, T.TYPE_STRING, opt, ""))
    msg("Request", ("service", 1, T.TYPE_STRING, opt, ""), ("method", 2, T.TYPE_STRING, opt, ""),
        ("payload", 3, T.TYPE_BYTES, opt, ""), ("timeout_nano", 4, T.TYPE_INT64, opt, ""),
        ("metadata", 5, T.TYPE_MESSAGE, rep, ".ttrpc.KeyValue"))
    # Wire-identical to google.rpc.Status (field numbers and types are what matter).
    msg("Status", ("code", 1, T.TYPE_INT32, opt, ""), ("message", 2, T.TYPE_STRING, opt, ""),
        ("details", 3, T.TYPE_MESSAGE, rep, ".google.protobuf.Any"))
    msg("Response", ("status", 1, T.TYPE_MESSAGE, opt, ".ttrpc.Status"),
        ("payload", 2, T.TYPE_BYTES, opt, ""))
    pool.Add(f)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ttrpc.{n}"))
            for n in ("Request", "Response", "Status")}


_WIRE = _wire_messages()
RequestMsg, ResponseMsg = _WIRE["Request"], _WIRE["Response"]


class TTRPCError(Exception):
    """A call that ended with a non-OK ttrpc Status (or never got one)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class ProtocolError(Exception):
    """The peer broke the framing rules; the connection must be dropped."""


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def code_of(number: int) -> grpc.StatusCode:
    return _CODES.get(number, grpc.StatusCode.UNKNOWN)


@dataclass(frozen=True)
class Header:
    length: int
    stream_id: int
    type: int
    flags: int


def encode(stream_id: int, mtype: int, data: bytes, flags: int = 0) -> bytes:
    """One framed message; oversized data is the caller's bug, refused here."""
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"ttrpc message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    return HEADER.pack(len(data), stream_id, mtype, flags) + data


class Decoder:
    """Splits a byte stream into (header, data) messages. Holds at most one message
    (≤ 4 MiB + header): a header announcing more is a ProtocolError."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[Header, bytes]]:
        """Takes `data` now; the complete messages are yielded lazily, so a consumer
        that gives up (a flooding peer) stops the work where it is."""
        self._buf += data
        return self._messages()

    def _messages(self) -> Iterator[tuple[Header, bytes]]:
        while len(self._buf) >= HEADER_LEN:
            h = Header(*HEADER.unpack_from(self._buf))
            if h.length > MAX_MESSAGE:
                raise ProtocolError(
                    f"ttrpc message of {h.length} bytes exceeds the {MAX_MESSAGE}-byte limit")
            end = HEADER_LEN + h.length
            if len(self._buf) < end:
                return
            body = bytes(self._buf[HEADER_LEN:end])
            del self._buf[:end]
            yield h, body


# A served method: (service, method, request payload) -> response payload, or TTRPCError.
Handler = Callable[[str, str, bytes], Awaitable[bytes]]
Sender = Callable[[bytes], Awaitable[None]]


def status_response(code: grpc.StatusCode, message: str) -> bytes:
    resp = ResponseMsg()
    resp.status.code = code.value[0]
    resp.status.message = message
    return resp.SerializeToString()


class Channel:
    """Client and server of one ttrpc byte stream.

    `send` writes bytes to the peer (it must keep each call's bytes together);
    `feed` is called with what arrives. `handler` serves the peer's requests (None:
    every request is Unimplemented). `on_error` is told once when the stream is unusable
    (a framing violation) so the owner can drop the connection."""

    def __init__(self, send: Sender, handler: Handler | None = None, *,
                 name: str = "ttrpc", on_error: Callable[[str], None] | None = None) -> None:
        self._send = send
        self._handler = handler
        self._name = name
        self._on_error = on_error
        self._decoder = Decoder()
        self._next_id = 1
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._last_peer_id = 0
        self._serving: set[asyncio.Task[None]] = set()
        self._closed: str | None = None

    # -- client --------------------------------------------------------------
    async def call(self, service: str, method: str, payload: bytes, timeout: float) -> bytes:
        """One unary call; raises TTRPCError (DEADLINE_EXCEEDED after `timeout` s,
        UNAVAILABLE when the stream is or becomes closed)."""
        if self._closed is not None:
            raise TTRPCError(grpc.StatusCode.UNAVAILABLE, self._closed)
        sid = self._next_id
        self._next_id += 2
        req = RequestMsg(service=service, method=method, payload=payload,
                         timeout_nano=int(timeout * 1e9))
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[sid] = fut
        try:
            async with asyncio.timeout(timeout):  # a peer that stops reading stalls the send
                await self._send(encode(sid, TYPE_REQUEST, req.SerializeToString()))
                data = await fut
        except TimeoutError:
            raise TTRPCError(grpc.StatusCode.DEADLINE_EXCEEDED,
                             f"{service}/{method}: no answer in {timeout:g}s") from None
        except (ConnectionError, OSError) as e:
            raise TTRPCError(grpc.StatusCode.UNAVAILABLE, f"{service}/{method}: {e}") from None
        finally:
            self._pending.pop(sid, None)
        try:
            resp = ResponseMsg.FromString(data)
        except DecodeError as e:
            raise TTRPCError(grpc.StatusCode.INTERNAL, f"bad ttrpc response: {e}") from None
        status: Any = resp.status
        if status.code != 0:
            raise TTRPCError(code_of(status.code), status.message)
        payload_out: bytes = resp.payload
        return payload_out

    # -- incoming -------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Bytes from the peer; dispatches every complete message."""
        if self._closed is not None:
            return
        try:
            for h, body in self._decoder.feed(data):
                self._dispatch(h, body)
                if self._closed is not None:
                    return
        except ProtocolError as e:
            self._fail(str(e))

    def _dispatch(self, h: Header, body: bytes) -> None:
        if h.type != TYPE_RESPONSE and len(self._serving) >= MAX_INFLIGHT:
            # Every request costs a task until answered: a peer that keeps more than
            # MAX_INFLIGHT open is flooding, not calling.
            raise ProtocolError(f"peer has more than {MAX_INFLIGHT} requests in flight")
        if h.type == TYPE_RESPONSE:
            fut = self._pending.get(h.stream_id)
            if fut is not None and not fut.done():
                fut.set_result(body)
            else:
                log.debug("%s: response for unknown stream %d dropped", self._name, h.stream_id)
        elif h.type == TYPE_REQUEST:
            self._on_request(h, body)
        else:
            # Data messages only exist for streaming calls, which NRI never makes.
            self._reply_status(h.stream_id, grpc.StatusCode.INVALID_ARGUMENT,
                               "ttrpc data messages are not supported (unary only)")

    def _on_request(self, h: Header, body: bytes) -> None:
        if h.stream_id % 2 != 1:
            self._reply_status(h.stream_id, grpc.StatusCode.INVALID_ARGUMENT,
                               "StreamID must be odd for client initiated streams")
            return
        if h.stream_id <= self._last_peer_id:
            self._reply_status(h.stream_id, grpc.StatusCode.INVALID_ARGUMENT,
                               "StreamID cannot be re-used and must increment")
            return
        self._last_peer_id = h.stream_id
        if h.flags & (FLAG_REMOTE_OPEN | FLAG_REMOTE_CLOSED):
            self._reply_status(h.stream_id, grpc.StatusCode.UNIMPLEMENTED,
                               "streaming calls are not supported")
            return
        task = asyncio.get_running_loop().create_task(self._serve(h.stream_id, body))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def _serve(self, sid: int, body: bytes) -> None:
        try:
            req: Any = RequestMsg.FromString(body)
        except DecodeError as e:
            await self._answer(sid, status_response(grpc.StatusCode.INVALID_ARGUMENT,
                                                    f"unmarshal request error: {e}"))
            return
        try:
            if self._handler is None:
                raise TTRPCError(grpc.StatusCode.UNIMPLEMENTED, f"service {req.service}")
            work = self._handler(req.service, req.method, req.payload)
            if req.timeout_nano > 0:
                out = await asyncio.wait_for(work, req.timeout_nano / 1e9)
            else:
                out = await work
            resp = ResponseMsg(payload=out).SerializeToString()
        except TTRPCError as e:
            resp = status_response(e.code, e.message)
        except TimeoutError:
            resp = status_response(grpc.StatusCode.DEADLINE_EXCEEDED, "handler timed out")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a handler bug must answer, not leave the peer waiting
            log.exception("%s: %s/%s failed", self._name, req.service, req.method)
            resp = status_response(grpc.StatusCode.UNKNOWN, str(e) or type(e).__name__)
        await self._answer(sid, resp)

    async def _answer(self, sid: int, resp: bytes) -> None:
        if self._closed is not None:
            return
        if len(resp) > MAX_MESSAGE:
            resp = status_response(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"response of {len(resp)} bytes exceeds {MAX_MESSAGE}")
        try:
            await self._send(encode(sid, TYPE_RESPONSE, resp))
        except (ConnectionError, OSError) as e:
            log.debug("%s: answer to stream %d lost: %s", self._name, sid, e)

    def _reply_status(self, sid: int, code: grpc.StatusCode, message: str) -> None:
        task = asyncio.get_running_loop().create_task(
            self._answer(sid, status_response(code, message)))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    # -- teardown -----------------------------------------------------------------
    def _fail(self, reason: str) -> None:
        log.warning("%s: closing connection: %s", self._name, reason)
        self.close(reason)
        if self._on_error is not None:
            self._on_error(reason)

    def close(self, reason: str = "connection closed") -> None:
        """Fails every pending call with UNAVAILABLE and cancels served requests."""
        if self._closed is not None:
            return
        self._closed = reason
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(TTRPCError(grpc.StatusCode.UNAVAILABLE, reason))
        for task in list(self._serving):
            task.cancel()

    async def wait_closed(self) -> None:
        """After close(): returns once every served request's task has ended."""
        while self._serving:
            await asyncio.gather(*self._serving, return_exceptions=True)

    @property
    def closed(self) -> bool:
        return self._closed is not None
