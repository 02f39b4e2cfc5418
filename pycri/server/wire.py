"""Answers already encoded: a servicer method may return the response's bytes.

The kubelet asks for the same pods' and containers' status every second, and the
answer changes only when the record does. Encoding it once per record revision
(server/itemcache.py) and handing gRPC the bytes skips building and serializing the
message on every call. Protobuf defines the concatenation of two encoded messages as
their merge (repeated fields appended, singular fields of the later one winning), so
an answer is assembled from cached parts with `b"".join`:

    ListContainersResponse(containers=[a]) + ListContainersResponse(containers=[b])
      == ListContainersResponse(containers=[a, b])

`register` installs a service as the generated `add_*Servicer_to_server` would, with
every response serializer letting `bytes` through as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc


def register(add_to_server: Callable[[Any, Any], None], servicer: Any,
             server: grpc.aio.Server) -> None:  # fmt: skip
    """`add_to_server(servicer, server)` (generated), its methods free to return bytes."""
    add_to_server(servicer, _BytesThrough(server))


def _bytes_through(handler: Any) -> Any:
    """`handler` (a grpc.RpcMethodHandler, a named tuple) with a response serializer that
    sends bytes as they are."""
    serialize = handler.response_serializer

    def encode(response: Any) -> bytes:
        return response if type(response) is bytes else serialize(response)

    return handler._replace(response_serializer=encode)


class _BytesThrough:
    """The part of a server the generated code calls. It hands the same method table to
    both calls below; the table is registered from the second, both ways, rewritten."""

    def __init__(self, server: Any) -> None:  # grpc-stubs lack the registered methods
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        pass  # the same table comes again through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str,
                                       handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        table = {name: _bytes_through(h) for name, h in handlers.items()}
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, table),))
        self._server.add_registered_method_handlers(service, table)
