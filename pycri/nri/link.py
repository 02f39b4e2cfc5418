"""One connected NRI plugin, seen from the runtime side.

`PluginLink` owns the plugin's socket: it serves the NRI Runtime service the plugin
calls (RegisterPlugin, UpdateContainers) by handing each request to the `RuntimeSide`
(pycri/nri/adaptation.py), and it calls the plugin's Plugin service for the
adaptation. It knows nothing of lifecycle or policy: who is registered, what gets
sent and what a timeout means are the adaptation's decisions.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from pycri import metrics
from pycri.nri.api import api_pb2 as api
from pycri.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Wire
from pycri.nri.ttrpc import Handler, TTRPCError

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

PLUGIN_SERVICE = api.DESCRIPTOR.services_by_name["Plugin"].full_name
RUNTIME_SERVICE = api.DESCRIPTOR.services_by_name["Runtime"].full_name


class NRIPluginError(Exception):
    """A call to a plugin failed: it answered an error, timed out, or is gone."""

    def __init__(self, plugin: str, method: str, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"NRI plugin {plugin or '(unregistered)'}: {method}: "
                         f"{code.name}: {message}")
        self.plugin = plugin
        self.method = method
        self.code = code
        self.message = message

    @property
    def timed_out(self) -> bool:
        return self.code == grpc.StatusCode.DEADLINE_EXCEEDED


def service_handler(service: str,
                    serve: Callable[[str, Message], Awaitable[Message]]) -> Handler:
    """A ttrpc handler for one NRI service: decodes each request into its api message
    type (from the proto's service descriptor) and encodes `serve`'s reply."""
    methods = api.DESCRIPTOR.services_by_name[service.rsplit(".", 1)[-1]].methods_by_name

    async def handle(svc: str, method: str, payload: bytes) -> bytes:
        if svc != service:
            raise TTRPCError(grpc.StatusCode.UNIMPLEMENTED, f"service {svc}")
        desc = methods.get(method)
        if desc is None:
            raise TTRPCError(grpc.StatusCode.UNIMPLEMENTED, f"method {method}")
        request_type: type[Message] = getattr(api, desc.input_type.name)
        try:
            request = request_type.FromString(payload)
        except DecodeError as e:
            raise TTRPCError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{method}: cannot decode request: {e}") from None
        reply = await serve(method, request)
        return reply.SerializeToString()
    return handle


class RuntimeSide(Protocol):
    """What a link hands the plugin's requests to (nri-life's adaptation)."""

    async def register_plugin(self, link: PluginLink, req: api.RegisterPluginRequest) -> None: ...

    async def update_containers(self, link: PluginLink, req: api.UpdateContainersRequest
                                ) -> api.UpdateContainersResponse: ...


class PluginLink:
    """One plugin connection: serves its Runtime-service calls, makes Plugin-service calls.

    An exception the RuntimeSide raises becomes the plugin's error status: a TTRPCError
    keeps its code, anything else is UNKNOWN with its message."""

    def __init__(self, sock: socket.socket, runtime: RuntimeSide) -> None:
        self.name = ""
        self.index = ""
        self._runtime = runtime
        self._registered = False
        self._wire = Wire(sock, call_conn=PLUGIN_SERVICE_CONN, serve_conn=RUNTIME_SERVICE_CONN,
                          handler=service_handler(RUNTIME_SERVICE, self._serve),
                          name="nri-plugin")
        self.closed: asyncio.Event = self._wire.closed

    def __repr__(self) -> str:
        return f"PluginLink({self.index}-{self.name})" if self._registered else "PluginLink(?)"

    @property
    def reason(self) -> str:
        """Why the link closed (empty while open)."""
        return self._wire.reason

    async def start(self) -> None:
        """Starts serving the plugin; returns at once."""
        await self._wire.start()

    async def _serve(self, method: str, request: Message) -> Message:
        if method == "RegisterPlugin":
            assert isinstance(request, api.RegisterPluginRequest)
            if self._registered:
                raise TTRPCError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"plugin {self.index}-{self.name} is already registered")
            self.name, self.index = request.plugin_name, request.plugin_idx
            self._registered = True
            await self._runtime.register_plugin(self, request)
            return api.Empty()
        if method == "UpdateContainers":
            assert isinstance(request, api.UpdateContainersRequest)
            if not self._registered:
                raise TTRPCError(grpc.StatusCode.FAILED_PRECONDITION,
                                 "UpdateContainers before RegisterPlugin")
            return await self._runtime.update_containers(self, request)
        raise TTRPCError(grpc.StatusCode.UNIMPLEMENTED, f"method {method}")

    async def call(self, method: str, request: Message, response_type: type[M],
                   timeout: float) -> M:
        """One Plugin-service call; raises NRIPluginError (its `timed_out` says whether
        the plugin let `timeout` pass, in which case the caller decides its fate)."""
        try:
            with metrics.timed(metrics.NRI_SECONDS.labels(self.name, method),
                               metrics.NRI_ERRORS.labels(self.name, method)):  # fmt: skip
                data = await self._wire.call(PLUGIN_SERVICE, method,
                                             request.SerializeToString(), timeout)
        except TTRPCError as e:
            raise NRIPluginError(self.name, method, e.code, e.message) from None
        try:
            return response_type.FromString(data)
        except DecodeError as e:
            raise NRIPluginError(self.name, method, grpc.StatusCode.INTERNAL,
                                 f"cannot decode {response_type.__name__}: {e}") from None

    async def close(self) -> None:
        """Drops the connection; pending calls fail, served requests are cancelled."""
        await self._wire.close()
