"""Open a TCP connection to a port on a pod's loopback, from inside its network namespace.

A socket belongs to the namespace it was created in, whichever namespace the thread
using it later sits in. So a fresh, short-lived thread setns(2)s into the pod's
namespace, creates and connects the socket, and setns's back; the daemon's other
threads never leave the host namespace, and the thread dies afterwards even if
returning failed. A host-network pod is dialled from the host namespace directly.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import threading

from pycri.errors import FailedPrecondition

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
DIAL_TIMEOUT = 10.0
LOOPBACKS = ("127.0.0.1", "::1")


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _connect(port: int, timeout: float) -> socket.socket:
    """Try each loopback address; the last error explains a failure."""
    error: OSError | None = None
    for host in LOOPBACKS:
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            error = e
            continue
        sock.setblocking(False)
        return sock
    assert error is not None
    raise error


def _connect_in(netns: str, port: int, timeout: float) -> socket.socket:
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            return _connect(port, timeout)
        finally:
            _setns(own)
    finally:
        os.close(own)


async def dial(netns: str | None, port: int, timeout: float = DIAL_TIMEOUT) -> socket.socket:
    """A connected, non-blocking socket to localhost:`port` in `netns` (None: the host)."""
    if not 0 < port < 65536:
        raise FailedPrecondition(f"invalid port {port}")
    if netns is None:
        return await asyncio.to_thread(_connect, port, timeout)
    loop = asyncio.get_running_loop()
    result: asyncio.Future[socket.socket] = loop.create_future()

    def body() -> None:
        try:
            sock = _connect_in(netns, port, timeout)
        except BaseException as e:
            loop.call_soon_threadsafe(_settle, result, None, e)
        else:
            loop.call_soon_threadsafe(_settle, result, sock, None)

    threading.Thread(target=body, name=f"dial-{port}", daemon=True).start()
    return await result


def _settle(
    fut: asyncio.Future[socket.socket], sock: socket.socket | None, error: BaseException | None
) -> None:
    if fut.cancelled():
        if sock is not None:
            sock.close()
    elif error is not None:
        fut.set_exception(error)
    else:
        assert sock is not None
        fut.set_result(sock)
