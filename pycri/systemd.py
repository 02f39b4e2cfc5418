"""The two systemd protocols a service speaks: sd_notify and socket activation.

Both are a few lines of stdlib, so no libsystemd binding: notify messages are
datagrams to $NOTIFY_SOCKET (a path, or `@name` in the abstract namespace), and an
activated listener arrives as fd 3 with $LISTEN_FDS/$LISTEN_PID. Every variable is
removed from our environment once read, so conmon, runc and CNI plugins never see
them (runc would otherwise take NOTIFY_SOCKET for the container's).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

LISTEN_FDS_START = 3  # SD_LISTEN_FDS_START
MIN_WATCHDOG_INTERVAL = 0.05


def _for_us(environ: MutableMapping[str, str], pid_key: str, required: bool) -> bool:
    """A *_PID variable must name this process (else a parent's was inherited).

    sd_listen_fds() requires LISTEN_PID; sd_watchdog_enabled() accepts no WATCHDOG_PID.
    """
    pid = environ.pop(pid_key, "")
    return pid == str(os.getpid()) if pid or required else True


class Notifier:
    """Sends READY/STOPPING/WATCHDOG to the service manager; a no-op outside systemd.

    The socket is non-blocking and a full queue drops the message (logged once): the
    event loop never waits on the manager. The watchdog pings from the event loop on
    purpose, so a wedged loop stops them and systemd restarts the daemon.
    """

    def __init__(self, environ: MutableMapping[str, str] = os.environ) -> None:
        addr = environ.pop("NOTIFY_SOCKET", "")
        usec = environ.pop("WATCHDOG_USEC", "")
        watchdog_ours = _for_us(environ, "WATCHDOG_PID", required=False)
        self._addr = "\0" + addr[1:] if addr.startswith("@") else addr
        self._sock: socket.socket | None = None
        if self._addr:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)
        self.watchdog_interval: float | None = None
        if self._sock is not None and watchdog_ours and usec.isdigit() and int(usec) > 0:
            # Half the timeout, as sd_watchdog_enabled() advises; a floor keeps a
            # mistyped WatchdogSec from turning the pinger into a busy loop.
            self.watchdog_interval = max(int(usec) / 2e6, MIN_WATCHDOG_INTERVAL)
        self._dropped = False
        self._watchdog: asyncio.Task[None] | None = None

    def notify(self, message: str) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendto(message.encode(), self._addr)
        except OSError as e:  # BlockingIOError (queue full), ECONNREFUSED, ENOENT
            if not self._dropped:
                log.warning("sd_notify to %r failed: %s (further failures not logged)",
                            self._addr, e)
                self._dropped = True

    def start_watchdog(self) -> None:
        if self.watchdog_interval is not None and self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._ping())

    async def _ping(self) -> None:
        assert self.watchdog_interval is not None
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_interval)

    def stopping(self) -> None:
        """STOPPING=1, and no pings after it: the stop has its own timeout."""
        self._stop_watchdog()
        self.notify("STOPPING=1")

    def _stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def close(self) -> None:
        self._stop_watchdog()
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class ActivationError(Exception):
    """The inherited fds are not the one unix stream listener pycri can serve."""


def listen_socket(environ: MutableMapping[str, str] = os.environ) -> socket.socket | None:
    """The socket-activated CRI listener (fd 3), or None when not socket-activated.

    The fd is made close-on-exec at once: containers' monitors must not hold the
    runtime's listening socket.
    """
    count = environ.pop("LISTEN_FDS", "")
    ours = _for_us(environ, "LISTEN_PID", required=True)
    environ.pop("LISTEN_FDNAMES", None)
    if not count or not ours:
        return None
    if count != "1":
        raise ActivationError(f"LISTEN_FDS={count}: pycri serves exactly one socket")
    try:
        sock = socket.socket(fileno=LISTEN_FDS_START)
    except OSError as e:
        raise ActivationError(f"LISTEN_FDS=1 but fd 3 is not a socket: {e.strerror}") from None
    sock.set_inheritable(False)
    listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM or not listening:
        sock.close()
        raise ActivationError("the activated socket must be a listening unix stream socket "
                              "(ListenStream=/run/pycri/pycri.sock)")
    return sock


def grpc_target(sock: socket.socket) -> str | None:
    """A gRPC target naming the socket's bound address, None if it has no name."""
    name = sock.getsockname()
    if isinstance(name, bytes):
        name = name.decode(errors="surrogateescape")
    if not name:
        return None
    return f"unix-abstract:{name[1:]}" if name.startswith("\0") else f"unix:{name}"
