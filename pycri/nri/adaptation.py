"""The runtime side of NRI: plugins connect, register, are configured and synchronized,
then hear about the pod and container events they subscribed to.

What the managers call (one method per lifecycle hook) returns at once when no plugin
wants the event: a set lookup, nothing awaited. Otherwise the event goes to every
subscribed plugin in order (index, then name), one event at a time across the node, as
the protocol's own runtimes do: plugins may assume they never see two at once.

- A plugin that answers with an error fails the hook; for Run/Create/Start/Update that
  fails the RPC (the manager undoes its work), for the others it is logged.
- A plugin that times out (`request_timeout`), or whose connection breaks, is
  disconnected and the operation proceeds without it.
- No container is missed by a plugin joining: it joins the plugin list and gets its
  Synchronize snapshot in one step (no await between), and an event that counted it in
  waits for its Synchronize to end before being sent to it. The snapshot holds every pod
  and container whose first hook (RunPodSandbox, CreateContainer) was issued, so
  whatever was announced before the join is in it, and whatever after is sent to it.
- After a restart the recovered containers' OCI specs (what a snapshot says of their
  process, mounts and resources) are read only when the first plugin connects, off the
  loop, and every plugin joins only once they are read: a node with no plugin never
  reads them, and none delays the socket's first answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import Message

from pycri import __version__
from pycri.api import api_pb2 as pb
from pycri.config import NRIConfig
from pycri.errors import InvalidArgument, PycriError
from pycri.nri import convert, launch
from pycri.nri.api import api_pb2 as api
from pycri.nri.checks import AdjustmentError
from pycri.nri.link import NRIPluginError, PluginLink
from pycri.nri.merge import merge_adjustments, merge_updates, take_update
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
Spec = dict[str, Any]
SpecReader = Callable[[str], Spec | None]  # a container's OCI spec on disk, None if gone
# Applies container updates requested by plugins; returns the ones that failed.
UpdateFn = Callable[[Sequence[api.ContainerUpdate]], Awaitable[list[api.ContainerUpdate]]]

RUNTIME_NAME = "pycri"
# A Synchronize message stays below ttrpc's 4 MiB message bound; bigger snapshots are
# sent in parts (`more`), as the protocol allows.
SYNC_CHUNK_BYTES = 3 << 20
SHUTDOWN_TIMEOUT = 1.0
ALL_EVENTS = (1 << (api.LAST - 1)) - 1
# Set while plugins' own updates are applied: they go through UpdateContainerResources'
# path but are no news to the plugins (nor must they wait for the hook they came from).
_applying: contextvars.ContextVar[bool] = contextvars.ContextVar("nri_applying",
                                                                 default=False)


class NRIRefused(PycriError):
    """A plugin answered a hook with an error: the request fails (and is undone)."""


def _bit(event: int) -> int:
    return 1 << (event - 1)


@dataclass(eq=False)
class Plugin:
    index: str = ""  # filled by registration (a pre-installed plugin's: its file name)
    base: str = ""
    config: str = ""  # a pre-installed plugin's config file, sent in Configure
    preinstalled: bool = False  # started from plugin_path, not connected to the socket
    events: int = 0
    registered: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    link: PluginLink = field(init=False)

    @property
    def name(self) -> str:
        return f"{self.index}-{self.base}" if self.base else "(unregistered)"

    @property
    def order(self) -> tuple[str, str]:
        return (self.index, self.base)

    @property
    def closed(self) -> bool:
        return self.link.closed.is_set()


class Adaptation:
    """Every connected plugin and what they were told; see the module docstring."""

    def __init__(self, cfg: NRIConfig) -> None:
        self.cfg = cfg
        self.plugins: list[Plugin] = []  # registered, configured, in call order
        # The container manager's update path (wired by the daemon).
        self.apply_updates: UpdateFn | None = None
        self._wanted = 0  # union of the plugins' event masks
        self._pods: dict[str, Sandbox] = {}  # announced to plugins (RunPodSandbox issued)
        self._containers: dict[str, tuple[Container, Spec]] = {}  # CreateContainer issued
        self._unread: set[str] = set()  # recovered containers whose spec is not read yet
        self._read_spec: SpecReader = lambda cid: None
        self._reading = asyncio.Lock()
        self._stopped_pods: set[str] = set()
        self._lock = asyncio.Lock()  # one event at a time, in every plugin
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._external: set[Plugin] = set()  # connected through the socket, not yet gone
        self._launched: list[launch.Launched] = []
        self._tasks: set[asyncio.Task[None]] = set()

    # -- state known before any plugin --------------------------------------------------

    def load(self, pods: Iterable[Sandbox], containers: Iterable[Container],
             read_spec: SpecReader) -> None:
        """What recovery found; the containers' specs are read by `read_spec` (file reads)
        when a plugin first connects (`_read_specs`)."""
        self._pods.update((sb.id, sb) for sb in pods)
        for c in containers:
            self._containers[c.id] = (c, {})
            self._unread.add(c.id)
        self._read_spec = read_spec

    async def _read_specs(self) -> None:
        """Fill in the recovered containers' specs, in a worker thread, once; a container
        removed meanwhile stays out."""
        async with self._reading:
            unread = [entry[0] for cid in self._unread if (entry := self._containers.get(cid))]
            if unread:
                views = await asyncio.to_thread(
                    lambda: [convert.spec_view(self._read_spec(c.id) or {}) for c in unread])
                for c, view in zip(unread, views, strict=True):
                    if (entry := self._containers.get(c.id)) is not None and entry[0] is c:
                        self._containers[c.id] = (c, view)
            self._unread.clear()

    # -- connections --------------------------------------------------------------------

    def listen(self, sock: socket.socket) -> None:
        """Accept plugin connections on a bound, listening socket."""
        sock.setblocking(False)
        self._listener = sock
        self._accepting = asyncio.ensure_future(self._accept(sock))

    async def unlisten(self) -> None:
        """Stop accepting and close the listener; connected plugins stay connected."""
        if self._accepting is not None:
            self._accepting.cancel()  # first, so the loop no longer watches the fd
            await asyncio.gather(self._accepting, return_exceptions=True)
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as e:
                log.error("NRI: accepting a plugin connection: %s", e)
                await asyncio.sleep(0.1)  # e.g. EMFILE: do not spin
                continue
            p = Plugin()
            self._external.add(p)  # at once: disconnect_external() must see it
            self._spawn(self.connect(conn, p))

    async def launch(self) -> None:
        """Start the pre-installed plugins and connect them, in order, before any
        request is served (as the protocol's runtimes do)."""
        cfg = self.cfg
        self._launched = await launch.launch_all(Path(cfg.plugin_path),
                                                 Path(cfg.plugin_config_path))
        for started in self._launched:
            plugin = started.plugin
            await self.connect(started.sock, Plugin(index=plugin.index, base=plugin.name,
                                                    config=plugin.config, preinstalled=True))

    async def connect(self, conn: socket.socket, p: Plugin | None = None) -> None:
        """Serve one plugin over `conn` (accepted, or the pycri end of a launched
        plugin's socketpair): registration, Configure, Synchronize, then events."""
        side = _RuntimeSide(self)
        p = side.plugin = p or Plugin()
        p.link = PluginLink(conn, side)
        try:
            await p.link.start()
            await self._handshake(p)
        except (NRIPluginError, PycriError) as e:
            log.warning("NRI: plugin %s not connected: %s", p.name, e)
            await self._gone(p)
            return
        except Exception:
            log.exception("NRI: plugin %s not connected", p.name)
            await self._gone(p)
            return
        self._spawn(self._watch(p))

    async def _handshake(self, p: Plugin) -> None:
        closed = asyncio.ensure_future(p.link.closed.wait())
        waits: list[asyncio.Future[Any]] = [p.registered, closed]
        try:
            await asyncio.wait(waits, timeout=self.cfg.registration_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if not p.registered.done():
            raise InvalidArgument("connection closed before registering" if p.closed else
                                  f"not registered within {self.cfg.registration_timeout}s")
        p.registered.result()  # raises for an invalid name or index
        reply = await p.link.call("Configure", api.ConfigureRequest(
            config=p.config,
            runtime_name=RUNTIME_NAME,
            runtime_version=__version__,
            registration_timeout=int(self.cfg.registration_timeout * 1000),
            request_timeout=int(self.cfg.request_timeout * 1000),
        ), api.ConfigureResponse, self.cfg.request_timeout)
        events = reply.events or ALL_EVENTS
        if events & ~ALL_EVENTS:
            raise InvalidArgument(f"plugin {p.name} subscribed to unknown events "
                                  f"0x{events & ~ALL_EVENTS:x}")
        p.events = events
        await self._read_specs()
        # Joining and the snapshot are one step: see the module docstring.
        self.plugins = sorted([*self.plugins, p], key=lambda q: q.order)
        self._wanted |= events
        pods, containers = self._snapshot()
        try:
            synced = await self._synchronize(p, pods, containers)
        except BaseException:
            self._drop(p)
            raise
        finally:
            p.synced.set()
        log.info("NRI: plugin %s connected and synchronized (%d pods, %d containers)",
                 p.name, len(pods), len(containers))
        await self._apply_replied([(p.name, synced)])

    def _snapshot(self) -> tuple[list[api.PodSandbox], list[api.Container]]:
        pods = [convert.pod_sandbox(sb) for sb in self._pods.values()]
        containers = [convert.container(c, spec) for c, spec in self._containers.values()]
        return pods, containers

    async def _synchronize(self, p: Plugin, pods: list[api.PodSandbox],
                           containers: list[api.Container]) -> api.SynchronizeResponse:
        """Synchronize is the end of registration: it gets `registration_timeout`."""
        parts = list(_sync_parts(pods, containers))
        for req in parts:
            reply = await p.link.call("Synchronize", req, api.SynchronizeResponse,
                                      self.cfg.registration_timeout)
            if req.more and (reply.update or not reply.more):
                raise InvalidArgument(f"plugin {p.name} does not handle a Synchronize in parts")
        return reply

    async def _watch(self, p: Plugin) -> None:
        await p.link.closed.wait()
        self._external.discard(p)
        if p in self.plugins:
            log.info("NRI: plugin %s disconnected", p.name)
            self._drop(p)

    async def _gone(self, p: Plugin) -> None:
        self._external.discard(p)
        await p.link.close()

    def _forget(self, p: Plugin) -> None:
        """No more events for `p`."""
        self.plugins = [q for q in self.plugins if q is not p]
        wanted = 0
        for q in self.plugins:
            wanted |= q.events
        self._wanted = wanted

    def _drop(self, p: Plugin) -> None:
        self._forget(p)
        if not p.closed:
            self._spawn(p.link.close())

    async def _shut_down(self, plugins: Iterable[Plugin]) -> None:
        """Tell each plugin (Shutdown) and disconnect it, with no event between: the
        event lock is held, so a hook in flight ends first."""
        async with self._lock:
            for p in plugins:
                registered = p in self.plugins
                self._forget(p)
                if registered and not p.closed:
                    with contextlib.suppress(NRIPluginError):
                        await p.link.call("Shutdown", api.Empty(), api.Empty, SHUTDOWN_TIMEOUT)
                await self._gone(p)

    async def disconnect_external(self) -> None:
        """Shut down every plugin that came through the socket (also those still
        registering); pre-installed plugins stay."""
        await self._shut_down(list(self._external))

    async def stop_preinstalled(self) -> None:
        """Shut down the pre-installed plugins and end their processes."""
        launched, self._launched = self._launched, []
        await self._shut_down([p for p in self.plugins if p.preinstalled])
        for started in launched:
            await launch.stop(started)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Daemon shutdown (or NRI disabled by a reload): tell every plugin, disconnect
        them, end the pre-installed ones. What pods and containers exist is kept."""
        await self.unlisten()
        await self._shut_down(dict.fromkeys([*self.plugins, *self._external]))
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.stop_preinstalled()

    # -- registration (called by a PluginLink) ------------------------------------------

    def registered(self, p: Plugin, req: api.RegisterPluginRequest) -> None:
        """RegisterPlugin: a bad name or index is refused, and the plugin not connected."""
        if p.registered.done():
            raise InvalidArgument("plugin already registered")
        if not launch.PLUGIN_NAME.fullmatch(req.plugin_name):
            err = InvalidArgument(f"invalid plugin name {req.plugin_name!r}")
        elif not launch.PLUGIN_INDEX.fullmatch(req.plugin_idx):
            err = InvalidArgument(f"invalid plugin index {req.plugin_idx!r} (two digits)")
        else:
            if not p.base:  # a pre-installed plugin is known by its file name
                p.index, p.base = req.plugin_idx, req.plugin_name
            log.info("NRI: plugin %s registered (NRI %s)", p.name, req.NRI_version or "?")
            p.registered.set_result(None)
            return
        p.registered.set_exception(err)
        raise err

    # -- fan-out ------------------------------------------------------------------------

    def wants(self, event: int) -> bool:
        return bool(self._wanted & _bit(event))

    async def _call(self, event: int, method: str, req: Message, reply: type[M],
                    *, refuse: bool) -> list[tuple[str, M]]:
        """Send one event to its subscribers in order. A plugin's error fails the hook
        (NRIRefused) when `refuse`, else it is logged."""
        bit = _bit(event)
        targets = [p for p in self.plugins if p.events & bit]
        replies: list[tuple[str, M]] = []
        async with self._lock:
            for p in targets:
                await p.synced.wait()
                if p.closed or p not in self.plugins:
                    continue
                try:
                    replies.append((p.name, await p.link.call(
                        method, req, reply, self.cfg.request_timeout)))
                except NRIPluginError as e:
                    if e.timed_out or p.closed:
                        # The protocol's rule: such a plugin is gone, the request goes on.
                        log.error("NRI: plugin %s disconnected: %s", p.name, e)
                        self._drop(p)
                    elif refuse:
                        raise NRIRefused(f"plugin {p.name}: {e.message}") from e
                    else:
                        log.warning("NRI: %s", e)
        return replies

    async def _apply(self, updates: Sequence[api.ContainerUpdate]) -> None:
        """Updates to other containers a plugin asked for; applied with no NRI lock held
        (the update path takes container locks that a hook's caller may hold)."""
        if not updates:
            return
        for u in await self.update_containers(updates):
            log.warning("NRI: requested update of container %s failed", u.container_id)

    async def update_containers(self, updates: Sequence[api.ContainerUpdate]
                                ) -> list[api.ContainerUpdate]:
        """Plugins' updates (replies, or unsolicited); returns the ones that failed."""
        if self.apply_updates is None:
            return list(updates)
        token = _applying.set(True)
        try:
            return await self.apply_updates(updates)
        finally:
            _applying.reset(token)

    def _pod(self, sid: str) -> api.PodSandbox:
        sb = self._pods.get(sid)
        return convert.pod_sandbox(sb) if sb is not None else api.PodSandbox(id=sid)

    def _container(self, c: Container) -> api.Container:
        spec = self._containers.get(c.id, (c, {}))[1]
        return convert.container(c, spec)

    # -- pod hooks ----------------------------------------------------------------------

    async def run_pod_sandbox(self, sb: Sandbox) -> None:
        """The pod is set up but not yet READY (nor listed); an error fails the run."""
        self._pods[sb.id] = sb
        if self.wants(api.RUN_POD_SANDBOX):
            await self._call(api.RUN_POD_SANDBOX, "RunPodSandbox",
                             api.RunPodSandboxRequest(pod=convert.pod_sandbox(sb)),
                             api.RunPodSandboxResponse, refuse=True)

    async def undo_run_pod_sandbox(self, sb: Sandbox) -> None:
        """A run failed after its hook was issued: whoever heard of the pod hears it go."""
        if sb.id in self._pods:
            await self.stop_pod_sandbox(sb)
            await self.remove_pod_sandbox(sb)

    async def stop_pod_sandbox(self, sb: Sandbox) -> None:
        """Once per pod: its containers are stopped, its infra and network still there."""
        if sb.id in self._stopped_pods or sb.id not in self._pods:
            return
        self._stopped_pods.add(sb.id)
        if self.wants(api.STOP_POD_SANDBOX):
            await self._call(api.STOP_POD_SANDBOX, "StopPodSandbox",
                             api.StopPodSandboxRequest(pod=convert.pod_sandbox(sb)),
                             api.StopPodSandboxResponse, refuse=False)

    async def remove_pod_sandbox(self, sb: Sandbox) -> None:
        if self._pods.pop(sb.id, None) is None:
            return
        self._stopped_pods.discard(sb.id)
        if self.wants(api.REMOVE_POD_SANDBOX):
            await self._call(api.REMOVE_POD_SANDBOX, "RemovePodSandbox",
                             api.RemovePodSandboxRequest(pod=convert.pod_sandbox(sb)),
                             api.RemovePodSandboxResponse, refuse=False)

    async def update_pod_sandbox(self, sb: Sandbox, overhead: pb.LinuxContainerResources | None,
                                 resources: pb.LinuxContainerResources | None) -> None:
        """Before UpdatePodSandboxResources changes anything; an error fails it."""
        if sb.id not in self._pods or not self.wants(api.UPDATE_POD_SANDBOX):
            return
        req = api.UpdatePodSandboxRequest(pod=convert.pod_sandbox(sb))
        if overhead is not None:
            req.overhead_linux_resources.CopyFrom(convert.cri_resources(overhead))
        if resources is not None:
            req.linux_resources.CopyFrom(convert.cri_resources(resources))
        await self._call(api.UPDATE_POD_SANDBOX, "UpdatePodSandbox", req,
                         api.UpdatePodSandboxResponse, refuse=True)

    async def post_update_pod_sandbox(self, sb: Sandbox) -> None:
        """The pod's new resources are recorded (and written where pycri owns its cgroup)."""
        if sb.id in self._pods and self.wants(api.POST_UPDATE_POD_SANDBOX):
            await self._call(api.POST_UPDATE_POD_SANDBOX, "PostUpdatePodSandbox",
                             api.PostUpdatePodSandboxRequest(pod=convert.pod_sandbox(sb)),
                             api.PostUpdatePodSandboxResponse, refuse=False)

    # -- container hooks ----------------------------------------------------------------

    async def create_container(self, c: Container, spec: Spec) -> api.ContainerAdjustment | None:
        """The plugins' merged adjustment of `spec` (None: nothing to change); an error
        or a conflict between plugins fails the create. Updates they ask for other
        containers are applied before this returns."""
        self._containers[c.id] = (c, convert.spec_view(spec))
        if not self.wants(api.CREATE_CONTAINER):
            return None
        req = api.CreateContainerRequest(pod=self._pod(c.sandbox_id),
                                         container=convert.container(c, spec))
        replies = await self._call(api.CREATE_CONTAINER, "CreateContainer", req,
                                   api.CreateContainerResponse, refuse=True)
        adjustment = merge_adjustments([(n, r.adjust) for n, r in replies])
        await self._apply(merge_updates([(n, r.update) for n, r in replies],
                                        creating=c.id))
        return adjustment

    async def undo_create_container(self, c: Container) -> None:
        """A create failed after its hook was issued: the plugins hear it go."""
        if c.id in self._containers:
            await self.remove_container(c)

    async def post_create_container(self, c: Container, spec: Spec) -> None:
        """Created with `spec` (the adjusted one)."""
        self._containers[c.id] = (c, convert.spec_view(spec))
        await self._notify(api.POST_CREATE_CONTAINER, "PostCreateContainer",
                           api.PostCreateContainerRequest, api.PostCreateContainerResponse, c)

    async def start_container(self, c: Container) -> None:
        """Before the process starts; an error fails the start."""
        if self.wants(api.START_CONTAINER):
            await self._call(api.START_CONTAINER, "StartContainer", api.StartContainerRequest(
                pod=self._pod(c.sandbox_id), container=self._container(c)),
                api.StartContainerResponse, refuse=True)

    async def post_start_container(self, c: Container) -> None:
        await self._notify(api.POST_START_CONTAINER, "PostStartContainer",
                           api.PostStartContainerRequest, api.PostStartContainerResponse, c)

    async def update_container(self, c: Container, resources: api.LinuxResources
                               ) -> api.LinuxResources | None:
        """Before the runtime update; returns what the plugins change in it (None:
        nothing). An error fails UpdateContainerResources."""
        if _applying.get() or not self.wants(api.UPDATE_CONTAINER):
            return None
        replies = await self._call(api.UPDATE_CONTAINER, "UpdateContainer",
                                   api.UpdateContainerRequest(
                                       pod=self._pod(c.sandbox_id),
                                       container=self._container(c),
                                       linux_resources=resources),
                                   api.UpdateContainerResponse, refuse=True)
        own, others = take_update(merge_updates([(n, r.update) for n, r in replies]), c.id)
        await self._apply(others)
        return own

    async def post_update_container(self, c: Container) -> None:
        if not _applying.get():
            await self._notify(api.POST_UPDATE_CONTAINER, "PostUpdateContainer",
                               api.PostUpdateContainerRequest,
                               api.PostUpdateContainerResponse, c)

    async def stop_container(self, c: Container) -> None:
        """The container has exited (stopped, or by itself); once per container."""
        if c.id not in self._containers or not self.wants(api.STOP_CONTAINER):
            return
        replies = await self._call(api.STOP_CONTAINER, "StopContainer", api.StopContainerRequest(
            pod=self._pod(c.sandbox_id), container=self._container(c)),
            api.StopContainerResponse, refuse=False)
        await self._apply_replied(replies)

    async def remove_container(self, c: Container) -> None:
        if c.id not in self._containers:
            return
        try:
            await self._notify(api.REMOVE_CONTAINER, "RemoveContainer",
                               api.RemoveContainerRequest, api.RemoveContainerResponse, c)
        finally:
            self._containers.pop(c.id, None)

    async def _notify(self, event: int, method: str, request: Callable[..., Message],
                      reply: type[Message], c: Container) -> None:
        if self.wants(event):
            await self._call(event, method, request(
                pod=self._pod(c.sandbox_id), container=self._container(c)),
                reply, refuse=False)

    async def _apply_replied(self, replies: Sequence[tuple[str, Any]]) -> None:
        try:
            updates = merge_updates([(n, r.update) for n, r in replies])
        except AdjustmentError as e:  # the stop goes on; the updates do not
            log.error("NRI: %s", e)
            return
        await self._apply(updates)


class _RuntimeSide:
    """The Runtime service a plugin calls: registration and unsolicited updates."""

    plugin: Plugin

    def __init__(self, nri: Adaptation) -> None:
        self.nri = nri

    async def register_plugin(self, link: PluginLink, req: api.RegisterPluginRequest) -> None:
        self.nri.registered(self.plugin, req)

    async def update_containers(self, link: PluginLink, req: api.UpdateContainersRequest
                                ) -> api.UpdateContainersResponse:
        return api.UpdateContainersResponse(
            failed=await self.nri.update_containers(list(req.update)))


def _sync_parts(pods: list[api.PodSandbox], containers: list[api.Container]
                ) -> Iterable[api.SynchronizeRequest]:
    """The snapshot in messages of at most SYNC_CHUNK_BYTES (the last one has more=False)."""
    part = api.SynchronizeRequest()
    size = 0
    for objs, field_of in ((pods, lambda r: r.pods), (containers, lambda r: r.containers)):
        for obj in objs:
            n = obj.ByteSize() + 8
            if size and size + n > SYNC_CHUNK_BYTES:
                part.more = True
                yield part
                part, size = api.SynchronizeRequest(), 0
            field_of(part).append(obj)
            size += n
    yield part
