"""`pycri serve`: wire the components together and run the gRPC server.

Lifecycle rules set here for every later component:
- one daemon per state dir (an flock), a live socket is never taken over;
- SIGTERM/SIGINT stop accepting, let in-flight calls finish, exit 0 — and
  leave containers running (their monitors are not our children to kill);
- the daemon is a child subreaper, so monitors that daemonize are re-parented
  to it while it runs, and to init after it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import socket
import time
from pathlib import Path

import grpc

from pycri import malloc, procs
from pycri.api import api_pb2_grpc as pb_grpc
from pycri.config import Config
from pycri.container.manager import ContainerManager
from pycri.events import EventBus
from pycri.image.manager import ImageManager
from pycri.launcher import Launcher
from pycri.monitor.probe import start_time
from pycri.monitor.reaper import Reaper
from pycri.network import CNIManager
from pycri.recovery import Recovery
from pycri.sandbox.manager import SandboxManager
from pycri.server.image_service import ImageServicer
from pycri.server.runtime_service import RuntimeServicer
from pycri.status import NodeStatus
from pycri.store import Store
from pycri.store.db import StoreLocked
from pycri.streaming import RuntimeBackend, StreamingServer

log = logging.getLogger("pycri")

# In-flight RPCs get this long to finish after SIGTERM.
SHUTDOWN_GRACE = 10.0
SOCKET_MODE = 0o660


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


def _process_age() -> float:
    """Seconds since this process was started (its start time, in clock ticks after
    boot, against the boot time): what interpreter start and imports cost."""
    start = start_time(os.getpid()) or 0
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start / os.sysconf("SC_CLK_TCK")


class Daemon:
    """Owns the store, the domain components and the gRPC server."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.store: Store | None = None
        self.server: grpc.aio.Server | None = None
        self.images: ImageManager | None = None
        self.reaper: Reaper | None = None
        self.launcher: Launcher | None = None
        self.streaming: StreamingServer | None = None
        self._lock_fd: int | None = None
        self._recheck: asyncio.Task[None] | None = None

    async def start(self) -> None:
        t0 = time.monotonic()
        cfg = self.cfg
        self._lock_fd = _lock_state_dir(Path(cfg.state))
        malloc.tune()
        root = Path(cfg.root)
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Layers and container upper dirs keep images' setuid bits and device nodes;
        # no other user may reach them (the containerd/moby CVE-2021-41103 class).
        os.chmod(root, 0o700)
        try:
            self.store = store = Store(cfg.db_path)
        except StoreLocked as e:
            raise DaemonError(str(e)) from None
        self.reaper = Reaper()
        self.reaper.start()  # a child subreaper; child exits come through pidfds
        procs.set_max_concurrent(cfg.helpers.max_concurrent)
        pinned = [cfg.pause_image] if cfg.pause_image else []
        self.images = images = ImageManager(root, cfg.images, store, pinned)
        images.recover()
        cni = CNIManager.from_config(cfg.cni, root / "cni-cache")
        self.launcher = launcher = Launcher(cfg, self.reaper)
        bus = EventBus()
        sandboxes = SandboxManager(cfg, store, launcher, cni, images, bus)
        containers = ContainerManager(cfg, store, launcher, sandboxes, images, bus)
        sandboxes.containers = containers
        launcher.on_exit(sandboxes.on_exit)
        launcher.on_exit(containers.on_exit)
        # Serve first, recheck after (pycri/recovery.py): only the records are loaded,
        # and the exits missed while down read, before the socket answers; exits from
        # now on arrive by inotify.
        live = await sandboxes.recover() | await containers.recover()
        await launcher.watch(live)
        recovery = Recovery([sandboxes, containers])
        node = NodeStatus(cfg, store, cni.status, recovery.info)
        streaming = StreamingServer(
            cfg.streaming_address, RuntimeBackend(containers, sandboxes, launcher),
            limits=cfg.streaming,
        )
        try:
            await streaming.start()
        except OSError as e:
            raise DaemonError(f"streaming server on {cfg.streaming_address}: {e}") from None
        self.streaming = streaming
        sock = cfg.socket_path
        _claim_socket(sock)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 16 * 1024 * 1024),
                ("grpc.max_send_message_length", 32 * 1024 * 1024),
            ]
        )
        pb_grpc.add_RuntimeServiceServicer_to_server(
            RuntimeServicer(node, sandboxes, containers, streaming), server
        )
        pb_grpc.add_ImageServiceServicer_to_server(ImageServicer(images), server)
        if server.add_insecure_port(f"unix:{sock}") == 0:
            raise DaemonError(f"cannot listen on {sock}")
        await server.start()
        os.chmod(sock, SOCKET_MODE)
        self.server = server
        log.info("pycri serving on unix://%s (root %s, state %s): %d pods and %d containers "
                 "loaded, %.3fs after the start, %.2fs after the exec", sock, cfg.root, cfg.state,
                 len(sandboxes.sandboxes), len(containers.containers), time.monotonic() - t0,
                 _process_age())
        self._recheck = asyncio.create_task(recovery.run())

    async def stop(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recheck
            self._recheck = None
        if self.server is not None:
            await self.server.stop(SHUTDOWN_GRACE)
            self.server = None
            # Only a socket we served is ours to remove; a refused start leaves it alone.
            self.cfg.socket_path.unlink(missing_ok=True)
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

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT, then shut down gracefully."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await self.start()
            await stop.wait()
            log.info("signal received; finishing in-flight calls")
        finally:
            await self.stop()
        log.info("pycri stopped")
