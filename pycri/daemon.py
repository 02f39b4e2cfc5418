"""`pycri serve`: wire the components together and run the gRPC server.

Lifecycle rules set here for every later component:
- one daemon per state dir (an flock), a live socket is never taken over;
- SIGTERM/SIGINT stop accepting, let in-flight calls finish, exit 0 — and
  leave containers running (their monitors are not our children to kill);
- the daemon is a child subreaper, so monitors that daemonize are re-parented
  to it while it runs, and to init after it exits;
- under systemd it says READY=1 only once the CRI socket answers a Version call,
  STOPPING=1 at the signal, and serves a socket-activated listener through a relay
  (pycri/systemd.py, pycri/sockproxy.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import functools
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from pycri import malloc, metrics, metrics_listener, procs, reload, statemetrics
from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc as pb_grpc
from pycri.api import pulls_pb2_grpc
from pycri.cadvisor import door as cadvisor_door
from pycri.config import Config, ConfigError, NRIConfig
from pycri.container.manager import ContainerManager
from pycri.events import EventBus
from pycri.image.manager import ImageManager
from pycri.launcher import Launcher
from pycri.logs import setup_logging
from pycri.monitor.probe import start_time
from pycri.monitor.reaper import Reaper
from pycri.network import CNIManager
from pycri.nri import domain as nri_domain
from pycri.nri.adaptation import Adaptation
from pycri.nri.resources import apply_updates
from pycri.oci import mounts, userns
from pycri.rebuild import rebuild
from pycri.recovery import Recovery
from pycri.sandbox.manager import SandboxManager
from pycri.server import wire
from pycri.server.image_service import ImageServicer
from pycri.server.pulls_service import PullsServicer
from pycri.server.runtime_service import RuntimeServicer
from pycri.sockproxy import SocketProxy
from pycri.status import NodeStatus
from pycri.store import Store
from pycri.store.db import StoreDamaged, StoreLocked
from pycri.streaming import RuntimeBackend, StreamingServer
from pycri.systemd import ActivationError, Notifier, grpc_target, listen_socket

log = logging.getLogger("pycri")

# In-flight RPCs get this long to finish after SIGTERM.
SHUTDOWN_GRACE = 10.0
SOCKET_MODE = 0o660
# How long the READY probe waits for our own socket to answer Version.
READY_PROBE_TIMEOUT = 10.0
NRI_SOCKET_MODE = 0o600


class DaemonError(Exception):
    """A start-up problem worth one clear line to the operator."""


def _lock_state_dir(state: Path) -> int:
    """Hold an exclusive lock on <state>/pycri.lock for the daemon's lifetime."""
    state.mkdir(parents=True, exist_ok=True, mode=0o711)
    fd = os.open(state / "pycri.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DaemonError(f"another pycri is running with state dir {state}") from None
    return fd


def _claim_socket(path: Path) -> None:
    """Remove a stale socket left by a crashed run; refuse a live one."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    if not path.exists() and not path.is_symlink():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError as e:
        if e.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
            raise DaemonError(f"socket {path}: {e.strerror}") from None
        log.info("removing stale socket %s", path)
        path.unlink(missing_ok=True)
    else:
        raise DaemonError(f"socket {path} is served by another process; not taking it over")
    finally:
        probe.close()


def _bind_nri(path: Path) -> socket.socket:
    """A listener for NRI plugins on `path` (mode 0600); DaemonError if it cannot be had."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _claim_socket(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(str(path))
            os.chmod(path, NRI_SOCKET_MODE)
            sock.listen(64)
        except OSError:
            sock.close()
            raise
    except (DaemonError, OSError) as e:
        raise DaemonError(f"nri.socket_path: cannot listen on {path}: {e}") from None
    return sock


def _process_age() -> float:
    """Seconds since this process was started (its start time, in clock ticks after
    boot, against the boot time): what interpreter start and imports cost."""
    start = start_time(os.getpid()) or 0
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start / os.sysconf("SC_CLK_TCK")


class Daemon:
    """Owns the store, the domain components and the gRPC server."""

    def __init__(self, cfg: Config, loader: Callable[[], Config] | None = None) -> None:
        """`loader` reads and validates the config again (SIGHUP); raises ConfigError."""
        self.cfg = cfg
        self._loader = loader
        self._reloading = asyncio.Lock()
        self._collector: statemetrics.StateCollector | None = None
        self.store: Store | None = None
        self.server: grpc.aio.Server | None = None
        self.images: ImageManager | None = None
        self.reaper: Reaper | None = None
        self.launcher: Launcher | None = None
        self.cni: CNIManager | None = None
        self.node: NodeStatus | None = None
        self.sandboxes: SandboxManager | None = None
        self.containers: ContainerManager | None = None
        self.streaming: StreamingServer | None = None
        self.nri: Adaptation | None = None
        self._nri_socket: Path | None = None  # the NRI listener we bound, to unlink
        self._lock_fd: int | None = None
        self._stop_metrics: Callable[[], None] | None = None
        self.proxy: SocketProxy | None = None
        # Under socket activation gRPC listens privately and the relay serves the
        # inherited listener; otherwise gRPC listens on the configured path itself.
        self._grpc_socket = cfg.socket_path
        self._target = f"unix:{cfg.socket_path}"
        self._recheck: asyncio.Task[None] | None = None
        self._cadvisor: grpc.aio.Server | None = None
        self._cadvisor_link: cadvisor_door.Claim | None = None  # cAdvisor's default path

    async def start(self) -> None:
        t0 = time.monotonic()
        cfg = self.cfg
        # First, so no helper we spawn inherits LISTEN_FDS or the listener.
        try:
            activated = listen_socket()
        except ActivationError as e:
            raise DaemonError(str(e)) from None
        if activated is not None:
            self._grpc_socket = Path(cfg.state) / "grpc.sock"
            self._target = grpc_target(activated) or f"unix:{self._grpc_socket}"
            self.proxy = SocketProxy(activated, self._grpc_socket)
        self._lock_fd = _lock_state_dir(Path(cfg.state))
        malloc.tune()
        root = Path(cfg.root)
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Layers and container upper dirs keep images' setuid bits and device nodes;
        # no other user may reach them (the containerd/moby CVE-2021-41103 class).
        os.chmod(root, 0o700)
        try:
            self.store = store = Store(cfg.db_path)
        except (StoreLocked, StoreDamaged) as e:
            raise DaemonError(str(e)) from None
        self.reaper = Reaper()
        self.reaper.start()  # a child subreaper; child exits come through pidfds
        procs.set_max_concurrent(cfg.helpers.max_concurrent)
        pinned = [cfg.pause_image] if cfg.pause_image else []
        self.images = images = ImageManager(root, cfg.images, store, pinned)
        self.cni = cni = CNIManager.from_config(cfg.cni, root / "cni-cache")
        self.launcher = launcher = Launcher(cfg, self.reaper)
        if store.damaged is not None:  # before recover(), which sweeps what no record holds
            await rebuild(store, launcher, images, cni)
        images.recover()
        bus = EventBus()
        self.nri = nri = Adaptation(cfg.nri)
        sandboxes = SandboxManager(cfg, store, launcher, cni, images, bus, nri)
        containers = ContainerManager(cfg, store, launcher, sandboxes, images, bus)
        sandboxes.containers = containers
        domain: nri_domain.Containers = containers  # what NRI may do to containers
        nri.apply_updates = functools.partial(apply_updates, domain)
        launcher.on_exit(sandboxes.on_exit)
        launcher.on_exit(containers.on_exit)
        # Serve first, recheck after (pycri/recovery.py): only the records are loaded,
        # and the exits missed while down read, before the socket answers; exits from
        # now on arrive by inotify. What user-namespaced pods can run with is probed
        # meanwhile (~0.1 s).
        probe = asyncio.ensure_future(self._probe_userns())
        try:
            live = await sandboxes.recover() | await containers.recover()
        finally:
            support = await probe
        await launcher.watch(live)
        sandboxes.userns_support = support
        if support.kernel_problem:
            log.info("pods with their own user namespace cannot run here: %s",
                     support.kernel_problem)
        recovery = Recovery([sandboxes, containers])
        self.sandboxes, self.containers = sandboxes, containers
        if cfg.nri.enable:
            listener = None
            if reload.nri_listens(cfg.nri):
                try:
                    listener = _bind_nri(Path(cfg.nri.socket_path))
                except DaemonError as e:
                    # Another runtime's NRI (or a second pycri) holds it: pods still run.
                    log.error("NRI: plugins cannot connect: %s", e)
            await self._start_nri(listener)
        self.node = node = NodeStatus(cfg, store, cni.status, support, recovery.info)
        streaming = StreamingServer(
            cfg.streaming_address, RuntimeBackend(containers, sandboxes, launcher),
            limits=cfg.streaming,
        )
        try:
            await streaming.start()
        except OSError as e:
            raise DaemonError(f"streaming server on {cfg.streaming_address}: {e}") from None
        self.streaming = streaming
        self._collector = statemetrics.StateCollector(sandboxes, containers, launcher, streaming,
                                                      store)
        metrics.REGISTRY.register(self._collector)  # computes nothing until scraped
        if cfg.metrics_address:
            try:
                self._stop_metrics = metrics_listener.serve(cfg.metrics_address, cfg.metrics)
            except OSError as e:
                raise DaemonError(f"metrics on {cfg.metrics_address}: {e}") from None
            log.info("metrics on http://%s/metrics", cfg.metrics_address)
        if cfg.cadvisor.enable:
            await self._open_cadvisor(cadvisor_door.Sources(
                sandboxes=sandboxes.sandboxes, containers=containers.containers,
                image_name=images.display_name, spec_path=launcher.spec_path,
                pause_image=lambda: self.cfg.pause_image))
        sock = self._grpc_socket
        _claim_socket(sock)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 16 * 1024 * 1024),
                ("grpc.max_send_message_length", 32 * 1024 * 1024),
            ]
        )
        wire.register(pb_grpc.add_RuntimeServiceServicer_to_server,
                      RuntimeServicer(node, sandboxes, containers, streaming), server)
        wire.register(pb_grpc.add_ImageServiceServicer_to_server,
                      ImageServicer(images, cfg.lists), server)
        wire.register(pulls_pb2_grpc.add_PullsServicer_to_server, PullsServicer(images),
                      server)
        if server.add_insecure_port(f"unix:{sock}") == 0:
            raise DaemonError(f"cannot listen on {sock}")
        await server.start()
        self.server = server
        if activated is None:
            os.chmod(sock, SOCKET_MODE)
        else:
            os.chmod(sock, 0o600)  # the relay is its only client
            assert self.proxy is not None
            await self.proxy.start()
            log.info("socket-activated listener %s relayed to %s", self._target, sock)
        log.info("pycri serving on %s (root %s, state %s): %d pods and %d containers "
                 "loaded, %.3fs after the start, %.2fs after the exec", self._target, cfg.root,
                 cfg.state, len(sandboxes.sandboxes), len(containers.containers),
                 time.monotonic() - t0, _process_age())
        self._recheck = asyncio.create_task(recovery.run())

    async def _open_cadvisor(self, sources: cadvisor_door.Sources) -> None:
        """The door the kubelet's cAdvisor reads containers through, before the CRI
        socket answers: a kubelet asks its version once, at its own start."""
        cfg, sock = self.cfg.cadvisor, self.cfg.cadvisor_socket
        try:
            self._cadvisor = await cadvisor_door.serve(cadvisor_door.Door(sources), cfg, sock)
        except OSError as e:
            raise DaemonError(f"cadvisor: cannot listen on {sock}: "
                              f"{e.strerror or e}") from None
        if cfg.default_path:
            try:
                self._cadvisor_link = cadvisor_door.claim_default(Path(cfg.default_path), sock)
            except OSError as e:
                log.warning("cadvisor: cannot link %s to %s: %s", cfg.default_path, sock,
                            e.strerror or e)
        log.info("cadvisor: the kubelet's cAdvisor reads containers on %s%s", sock,
                 f" (and {self._cadvisor_link.link})" if self._cadvisor_link else "")

    async def _close_cadvisor(self) -> None:
        if self._cadvisor_link is not None:
            cadvisor_door.release_default(self._cadvisor_link)
            self._cadvisor_link = None
        if self._cadvisor is not None:
            await self._cadvisor.stop(None)
            self._cadvisor = None
            self.cfg.cadvisor_socket.unlink(missing_ok=True)

    async def wait_answering(self) -> None:
        """Return once the CRI socket answers Version: what READY=1 promises."""
        async with grpc.aio.insecure_channel(self._target) as channel:
            try:
                await pb_grpc.RuntimeServiceStub(channel).Version(
                    pb.VersionRequest(), timeout=READY_PROBE_TIMEOUT, wait_for_ready=True
                )
            except grpc.aio.AioRpcError as e:
                raise DaemonError(
                    f"{self._target} does not answer Version: {e.code().name} {e.details()}"
                ) from None

    async def _start_nri(self, sock: socket.socket | None) -> None:
        """Plugins must be told of what recovery found (or what runs, on a reload that
        enables NRI); the specs are read when the first plugin connects (pre-installed
        plugins, launched here, make that happen at once). `sock`: the listener, if any."""
        nri, launcher = self.nri, self.launcher
        assert nri is not None and launcher is not None and self.containers is not None
        assert self.sandboxes is not None
        nri.load(self.sandboxes.sandboxes.values(), self.containers.containers.values(),
                 launcher.spec)
        await nri.launch()
        if sock is not None:
            self._nri_listen(sock)

    def _nri_listen(self, sock: socket.socket) -> None:
        assert self.nri is not None
        self._nri_socket = Path(sock.getsockname())
        self.nri.listen(sock)
        log.info("NRI: plugins connect on %s", self._nri_socket)

    async def _nri_unlisten(self) -> None:
        """Close the NRI listener and remove its socket; connected plugins stay."""
        assert self.nri is not None
        await self.nri.unlisten()
        if self._nri_socket is not None:
            self._nri_socket.unlink(missing_ok=True)
            self._nri_socket = None

    async def stop(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recheck
            self._recheck = None
        if self.proxy is not None:
            self.proxy.stop_accepting()
        if self.server is not None:
            await self.server.stop(SHUTDOWN_GRACE)
            self.server = None
            # Only a socket we served is ours to remove; a refused start leaves it alone
            # (and an activated listener is systemd's, never unlinked).
            self._grpc_socket.unlink(missing_ok=True)
        if self.proxy is not None:
            await self.proxy.close()
            self.proxy = None
        await self._close_cadvisor()
        if self.nri is not None:
            await self.nri.close()
            self.nri = None
        if self._nri_socket is not None:
            self._nri_socket.unlink(missing_ok=True)
            self._nri_socket = None
        if self._stop_metrics is not None:
            await asyncio.to_thread(self._stop_metrics)  # waits for its serving thread
            self._stop_metrics = None
        if self._collector is not None:
            metrics.REGISTRY.unregister(self._collector)
            self._collector = None
        if self.streaming is not None:
            await self.streaming.stop()
            self.streaming = None
        if self.launcher is not None:
            self.launcher.close()
            self.launcher = None
        if self.reaper is not None:
            self.reaper.close()
            self.reaper = None
        if self.images is not None:
            await self.images.close()
            self.images = None
        if self.store is not None:
            self.store.close()
            self.store = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def reload(self) -> None:
        """SIGHUP: take the keys pycri can change live (reload.py) from the config file,
        all or nothing. Running pods and containers are not touched; one line says what
        changed, or which key made the new file unacceptable.

        What can fail (a listener on a new address) is done first and undone if a later
        step fails; only then is anything applied."""
        if self._loader is None:
            return
        async with self._reloading, contextlib.AsyncExitStack() as undo:
            metrics_stop: Callable[[], None] | None = None
            nri_sock: socket.socket | None = None
            try:
                new = await asyncio.to_thread(self._loader)
                changed = reload.changed_keys(self.cfg, new)
                reload.check(self.cfg, new, changed)
                if "metrics_address" in changed and new.metrics_address:
                    metrics_stop = await self._serve_metrics(new.metrics_address)
                    undo.push_async_callback(asyncio.to_thread, metrics_stop)
                if reload.nri_needs_new_listener(self.cfg.nri, new.nri):
                    nri_sock = _bind_nri(Path(new.nri.socket_path))
                    undo.callback(Path(new.nri.socket_path).unlink, missing_ok=True)
                    undo.callback(nri_sock.close)
            except (ConfigError, DaemonError) as e:
                log.error("config reload refused, the running config stays: %s", e)
                return
            undo.pop_all()
            await self._apply(new, changed, metrics_stop, nri_sock)
            log.info("config reloaded: %s", ", ".join(changed) or "nothing changed")

    async def _apply(self, new: Config, changed: list[str],
                     metrics_stop: Callable[[], None] | None,
                     nri_sock: socket.socket | None) -> None:
        """The accepted file's live keys into the running daemon (cannot fail)."""
        cfg = self.cfg
        cfg.log_level, cfg.log_format = new.log_level, new.log_format
        setup_logging(cfg)
        if "metrics_address" in changed:
            if self._stop_metrics is not None:
                await asyncio.to_thread(self._stop_metrics)
            self._stop_metrics, cfg.metrics_address = metrics_stop, new.metrics_address
        reload.assign(cfg.metrics, new.metrics)  # the listener reads its bounds from there
        cfg.default_runtime, cfg.runtimes = new.default_runtime, new.runtimes
        if self.launcher is not None:
            self.launcher.set_runtimes()
        handlers = any(k == "default_runtime" or k.startswith("runtimes.") for k in changed)
        if handlers:
            await self._reprobe_userns()
        # Read by the next pull (ImageManager shares this ImagesConfig).
        cfg.images.registries_conf = new.images.registries_conf
        cfg.images.registries_conf_dir = new.images.registries_conf_dir
        cfg.pause_image = new.pause_image  # read by the next RunPodSandbox
        if self.images is not None:
            self.images.set_pinned([cfg.pause_image] if cfg.pause_image else [])
        cfg.cni.conf_dir, cfg.cni.bin_dirs = new.cni.conf_dir, new.cni.bin_dirs
        cfg.cni.plugin_timeout = new.cni.plugin_timeout
        if self.cni is not None:
            self.cni.reconfigure(cfg.cni)
        reload.assign(cfg.cdi, new.cdi)
        reload.assign(cfg.checkpoint, new.checkpoint)
        if self.containers is not None:
            self.containers.cdi.reconfigure(cfg.cdi.spec_dirs, cfg.cdi.max_spec_bytes,
                                            cfg.cdi.max_spec_files)
            if handlers or any(k.startswith("checkpoint.") for k in changed):
                self.containers.checkpoint_support.forget()
        await self._reload_nri(new.nri, nri_sock)

    async def _reload_nri(self, new: NRIConfig, sock: socket.socket | None) -> None:
        """NRI after a reload (docs/operating.md): timeouts apply to the next call with
        every plugin staying; new plugin dirs restart the pre-installed plugins; a new
        socket path moves the listener (connected plugins stay); disable_connections
        closes it and disconnects the plugins that came through it; enable = false
        shuts NRI down, enable = true starts it as at start-up. `sock` is the listener
        bound for `new` (reload.nri_needs_new_listener)."""
        old = dataclasses.replace(self.cfg.nri)
        reload.assign(self.cfg.nri, new)  # the adaptation reads its timeouts from there
        nri = self.nri
        if nri is None or old == new:
            return
        if not new.enable:
            if old.enable:
                await self._nri_unlisten()
                await nri.close()
                log.info("NRI: disabled, every plugin disconnected")
            return
        if not old.enable:
            await self._start_nri(sock)
            return
        if (new.plugin_path, new.plugin_config_path) != (old.plugin_path,
                                                         old.plugin_config_path):
            await nri.stop_preinstalled()
            await nri.launch()
        if sock is not None:
            await self._nri_unlisten()
            self._nri_listen(sock)
        elif not reload.nri_listens(new) and reload.nri_listens(old):
            await self._nri_unlisten()
            await nri.disconnect_external()
            log.info("NRI: connections disabled, plugins connected through the socket "
                     "disconnected")

    async def _probe_userns(self) -> userns.Support:
        cfg = self.cfg
        return await userns.probe(
            {name: h.path for name, h in cfg.runtimes.items()}, cfg.default_runtime,
            Path(cfg.root), mounts.open_rootfs_area(cfg.state))

    async def _reprobe_userns(self) -> None:
        """What the reloaded handlers support (Status, and the pods run from now on)."""
        support = await self._probe_userns()
        if self.sandboxes is not None:
            self.sandboxes.userns_support = support
        if self.node is not None:
            self.node.set_userns(support)

    async def _serve_metrics(self, address: str) -> Callable[[], None]:
        """A metrics endpoint on `address`; returns its stop. DaemonError naming the key."""
        try:
            return await asyncio.to_thread(metrics_listener.serve, address, self.cfg.metrics)
        except OSError as e:
            raise DaemonError(f"metrics_address: cannot serve on {address}: {e}") from None

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT, then shut down gracefully."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        reloads: set[asyncio.Task[None]] = set()

        def hup() -> None:
            task = loop.create_task(self.reload())
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, hup)
        notifier = Notifier()
        try:
            await self.start()
            await self.wait_answering()
            notifier.notify(f"READY=1\nMAINPID={os.getpid()}\nSTATUS=serving on {self._target}")
            notifier.start_watchdog()
            await stop.wait()
            log.info("signal received; finishing in-flight calls")
            notifier.stopping()
        finally:
            await self.stop()
            notifier.close()
        log.info("pycri stopped")
