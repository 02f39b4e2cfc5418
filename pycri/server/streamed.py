"""The Stream* RPCs: each unary list's own answer, sent as a server stream in chunks.

A node with thousands of containers (or pods with hundreds of metrics each) makes a
ListContainers answer that outgrows the 16 MiB a gRPC client accepts by default.
The streamed variant runs the very handler of its unary list (same filters, same
items, same cache) and sends the items in messages bounded by count and by
serialized size. A single item larger than the byte bound still goes alone.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import grpc
from google.protobuf.message import Message

from pycri.config import ListsConfig
from pycri.server.errors import stream_rpc

# Per item on the wire beyond its own bytes: the field tag and the length prefix.
_FRAMING = 6


def chunked(items: Iterable[Message], limits: ListsConfig) -> Iterator[list[Message]]:
    """`items` in order, cut into lists of at most `stream_chunk_items` entries whose
    serialized size stays within `stream_chunk_bytes` (an oversized item goes alone)."""
    chunk: list[Message] = []
    size = 0
    for item in items:
        n = item.ByteSize() + _FRAMING
        if chunk and (len(chunk) >= limits.stream_chunk_items
                      or size + n > limits.stream_chunk_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += n
    if chunk:
        yield chunk


def _as_unary(request: Message, unary_request: type[Message]) -> Message:
    """The unary list request carrying the stream request's fields (its filter)."""
    out = unary_request()
    for field, value in request.ListFields():
        getattr(out, field.name).CopyFrom(value)
    return out


def streamed_list(
    name: str,
    unary: Callable[..., Any],
    unary_request: type[Message],
    items: str,
    response: type[Message],
    field: str,
    unary_response: type[Message] | None = None,
) -> Callable[..., AsyncIterator[Message]]:
    """The servicer method `name` streaming what `unary` (an `@rpc` list handler)
    answers in its repeated field `items`, as `response` messages' `field`.
    `unary_response`: the message a unary answering with bytes (wire.py) encoded.
    The servicer supplies `list_chunks` (config.ListsConfig)."""
    handler = inspect.unwrap(unary)  # the list's own logic, without its unary gate

    async def stream(self: Any, request: Message, context: grpc.aio.ServicerContext
                     ) -> AsyncIterator[Message]:
        answer = await handler(self, _as_unary(request, unary_request), context)
        if unary_response is not None:
            answer = unary_response.FromString(answer)
        for chunk in chunked(getattr(answer, items), self.list_chunks):
            yield response(**{field: chunk})

    stream.__name__ = stream.__qualname__ = name
    return stream_rpc(stream)
