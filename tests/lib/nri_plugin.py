"""THE test NRI plugin: the plugin side of the protocol over pycri's own wire code
(pycri/nri/mux.py + ttrpc.py), so every NRI test exercises the real framing.

It registers (name, index), answers Configure with its subscription mask, collects
Synchronize, answers every Plugin-service method, and records each request in
arrival order. A test steers it per method: `replies` (a message, or a function of
the request returning one), `errors` (answered as an error status), `delays`
(seconds slept before answering; past the runtime's request_timeout that is a hang).

Two faces: `NRIPlugin` (async, for tests that own an event loop) and `PluginThread`
(its own loop in a thread, sync calls, for the e2e tests that drive a pycri daemon).
Run as a program (`python -m tests.lib.nri_plugin`) it is a pre-installed plugin:
connected through NRI_PLUGIN_SOCKET, it appends every request to the JSON-lines file
named by NRI_TEST_PLUGIN_LOG (or its config's `log=` line) for the test to read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import threading
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from pycri.nri.api import api_pb2 as api
from pycri.nri.link import PLUGIN_SERVICE, RUNTIME_SERVICE, service_handler
from pycri.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Wire
from pycri.nri.ttrpc import TTRPCError

T = TypeVar("T")

_PLUGIN_METHODS = api.DESCRIPTOR.services_by_name["Plugin"].methods_by_name
# The lifecycle events a plugin can subscribe to, by their Plugin-service method.
EVENT_METHODS = {
    "RunPodSandbox": api.RUN_POD_SANDBOX, "StopPodSandbox": api.STOP_POD_SANDBOX,
    "RemovePodSandbox": api.REMOVE_POD_SANDBOX, "UpdatePodSandbox": api.UPDATE_POD_SANDBOX,
    "PostUpdatePodSandbox": api.POST_UPDATE_POD_SANDBOX,
    "CreateContainer": api.CREATE_CONTAINER, "PostCreateContainer": api.POST_CREATE_CONTAINER,
    "StartContainer": api.START_CONTAINER, "PostStartContainer": api.POST_START_CONTAINER,
    "UpdateContainer": api.UPDATE_CONTAINER, "PostUpdateContainer": api.POST_UPDATE_CONTAINER,
    "StopContainer": api.STOP_CONTAINER, "RemoveContainer": api.REMOVE_CONTAINER,
}
# The 12 events issue 9 lists (ValidateContainerAdjustment and PostUpdatePodSandbox
# are opt-in: a test adds them by name).
ALL_EVENTS = tuple(m for m in EVENT_METHODS if m != "PostUpdatePodSandbox")


def event_mask(methods: Iterable[str]) -> int:
    """The protocol's EventMask: bit (event - 1) per subscribed event."""
    mask = 0
    for m in methods:
        ev = api.VALIDATE_CONTAINER_ADJUSTMENT if m == "ValidateContainerAdjustment" \
            else EVENT_METHODS[m]
        mask |= 1 << (ev - 1)
    return mask


Reply = Message | Callable[[Message], Message]


class NRIPlugin:
    """An NRI plugin for tests (async face)."""

    def __init__(self, name: str = "test", idx: str = "50",
                 events: Iterable[str] = ALL_EVENTS) -> None:
        self.name = name
        self.idx = idx
        self.subscribe = list(events)
        self.replies: dict[str, Reply] = {}
        self.errors: dict[str, str] = {}
        self.delays: dict[str, float] = {}
        self.events: list[tuple[str, Message]] = []  # every request, in arrival order
        self.config: api.ConfigureRequest | None = None
        self.synced: api.SynchronizeRequest | None = None  # all parts of the Synchronize
        self.on_event: Callable[[str, Message], None] | None = None
        self._wire: Wire | None = None
        self._changed: asyncio.Condition | None = None
        self._configured: asyncio.Event | None = None

    @property
    def wire(self) -> Wire:
        assert self._wire is not None, "not connected"
        return self._wire

    @property
    def closed(self) -> asyncio.Event:
        return self.wire.closed

    async def connect(self, target: str | socket.socket, timeout: float = 10.0) -> None:
        """Connects (a socket path, or an already connected socket), registers and
        returns once the runtime has configured it, like the Go stub's Start()."""
        if isinstance(target, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, target)
            except OSError:
                sock.close()
                raise
        else:
            sock = target
            sock.setblocking(False)
        self._changed = asyncio.Condition()
        self._configured = asyncio.Event()
        self._wire = Wire(sock, call_conn=RUNTIME_SERVICE_CONN, serve_conn=PLUGIN_SERVICE_CONN,
                          handler=service_handler(PLUGIN_SERVICE, self._serve),
                          name=f"test-plugin-{self.idx}-{self.name}")
        await self._wire.start()
        req = api.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.idx)
        await self._wire.call(RUNTIME_SERVICE, "RegisterPlugin", req.SerializeToString(),
                              timeout)
        configured = asyncio.ensure_future(self._configured.wait())
        gone = asyncio.ensure_future(self._wire.closed.wait())
        done, pending = await asyncio.wait({configured, gone}, timeout=timeout,
                                           return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        if configured not in done:
            raise TimeoutError(f"plugin {self.idx}-{self.name} not configured "
                               f"({self._wire.reason or 'timeout'})")

    async def _serve(self, method: str, request: Message) -> Message:
        self.events.append((method, request))
        if self.on_event is not None:
            self.on_event(method, request)
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()
        delay = self.delays.get(method)
        if delay:
            await asyncio.sleep(delay)
        if method in self.errors:
            raise TTRPCError(grpc.StatusCode.UNKNOWN, self.errors[method])
        if method == "Configure":
            assert isinstance(request, api.ConfigureRequest)
            self.config = request
            assert self._configured is not None
            self._configured.set()
        elif method == "Synchronize":
            assert isinstance(request, api.SynchronizeRequest)
            if self.synced is None:
                self.synced = api.SynchronizeRequest()
            self.synced.pods.extend(request.pods)
            self.synced.containers.extend(request.containers)
        reply = self.replies.get(method)
        if callable(reply):
            return reply(request)
        if reply is not None:
            return reply
        return self._default_reply(method, request)

    def _default_reply(self, method: str, request: Message) -> Message:
        if method == "Configure":
            return api.ConfigureResponse(events=event_mask(self.subscribe))
        if method == "Synchronize":
            assert isinstance(request, api.SynchronizeRequest)
            return api.SynchronizeResponse(more=request.more)
        out: type[Message] = getattr(api, _PLUGIN_METHODS[method].output_type.name)
        return out()

    def names(self) -> list[str]:
        """The methods received so far, in order."""
        return [m for m, _ in self.events]

    async def wait_for(self, method: str, pred: Callable[[Any], bool] | None = None,
                       timeout: float = 10.0) -> Any:
        """The first recorded request of `method` (matching `pred`), waiting for it."""
        assert self._changed is not None

        def found() -> Message | None:
            for m, req in self.events:
                if m == method and (pred is None or pred(req)):
                    return req
            return None
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: found() is not None), timeout)
        return found()

    async def update_containers(self, updates: Iterable[api.ContainerUpdate],
                                evictions: Iterable[api.ContainerEviction] = (),
                                timeout: float = 10.0) -> list[api.ContainerUpdate]:
        """An unsolicited UpdateContainers; returns the updates the runtime reports failed."""
        req = api.UpdateContainersRequest(update=list(updates), evict=list(evictions))
        data = await self.wire.call(RUNTIME_SERVICE, "UpdateContainers",
                                    req.SerializeToString(), timeout)
        return list(api.UpdateContainersResponse.FromString(data).failed)

    async def close(self) -> None:
        if self._wire is not None:
            await self._wire.close()


class PluginThread:
    """An NRIPlugin on its own event loop thread, driven with plain calls.

    `plugin` is the NRIPlugin: its replies/errors/delays dicts may be set from the
    test thread at any time (single assignments are atomic)."""

    def __init__(self, name: str = "test", idx: str = "50",
                 events: Iterable[str] = ALL_EVENTS) -> None:
        self.plugin = NRIPlugin(name, idx, events)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name=f"nri-plugin-{idx}-{name}", daemon=True)
        self._thread.start()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout)

    def connect(self, target: str | socket.socket, timeout: float = 10.0) -> PluginThread:
        self._run(self.plugin.connect(target, timeout))
        return self

    def names(self) -> list[str]:
        return self._run(_call(self.plugin.names))

    def events(self) -> list[tuple[str, Message]]:
        return self._run(_call(lambda: list(self.plugin.events)))

    def wait_for(self, method: str, pred: Callable[[Any], bool] | None = None,
                 timeout: float = 10.0) -> Any:
        return self._run(self.plugin.wait_for(method, pred, timeout))

    def update_containers(self, updates: Iterable[api.ContainerUpdate],
                          timeout: float = 10.0) -> list[api.ContainerUpdate]:
        return self._run(self.plugin.update_containers(list(updates), timeout=timeout))

    def is_connected(self) -> bool:
        return self._run(_call(lambda: self.plugin._wire is not None
                               and not self.plugin.wire.closed.is_set()))

    def wait_closed(self, timeout: float = 10.0) -> None:
        self._run(asyncio.wait_for(self.plugin.wire.closed.wait(), timeout))

    def close(self) -> None:
        """Disconnects and stops the loop thread (idempotent)."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self._run(self.plugin.close(), timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> PluginThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _call(fn: Callable[[], T]) -> T:
    return fn()


def _log_path(config: str) -> str | None:
    for line in config.splitlines():
        if line.startswith("log="):
            return line[4:].strip()
    return os.environ.get("NRI_TEST_PLUGIN_LOG")


async def _main() -> int:
    """A pre-installed plugin: connection from NRI_PLUGIN_SOCKET (an inherited fd)."""
    fd = int(os.environ["NRI_PLUGIN_SOCKET"])
    sock = socket.socket(fileno=fd)
    plugin = NRIPlugin(os.environ.get("NRI_PLUGIN_NAME", "preinstalled"),
                       os.environ.get("NRI_PLUGIN_IDX", "00"))
    out: Any = None

    def record(method: str, request: Message) -> None:
        nonlocal out
        if out is None:
            cfg = request.config if isinstance(request, api.ConfigureRequest) else ""
            path = _log_path(cfg)
            out = open(path, "a", buffering=1) if path else False  # noqa: SIM115
        if out:
            out.write(json.dumps({"method": method, "pid": os.getpid(),
                                  "env": {k: v for k, v in os.environ.items()
                                          if k.startswith("NRI_PLUGIN_")},
                                  "request": json_format.MessageToDict(request)}) + "\n")
    plugin.on_event = record
    await plugin.connect(sock)
    await plugin.closed.wait()
    return 0


def main() -> int:
    return asyncio.run(_main())


if __name__ == "__main__":
    sys.exit(main())
