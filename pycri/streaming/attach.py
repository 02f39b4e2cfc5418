"""Attach to a running container through its conmon's attach socket.

conmon (run with `--full-attach`) listens on `<bundle>/attach`, a SOCK_SEQPACKET
socket. Every packet it sends is one chunk of the container's output behind a stream
byte (2 stdout, 3 stderr; a tty's output is all "stdout"); bytes we send are written
to the container's stdin as they are. Our shutdown(SHUT_WR) makes conmon close the
container's stdin unless the container keeps it open (`--leave-stdin-open`, i.e. the
container was not created with stdin_once). Resizes go through conmon's ctl fifo.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path
from typing import Any

from pycri.errors import FailedPrecondition
from pycri.monitor import conmon
from pycri.streaming.remotecommand import StreamIO

STDOUT, STDERR = 2, 3
# Input packets stay well below conmon's read buffer, which would truncate a larger one.
INPUT_CHUNK = 4096
PACKET = 65536


async def connect(bundle: Path) -> socket.socket:
    """Connect to the attach socket through /proc/self/fd, so a long bundle path cannot
    exceed the 108-byte sun_path limit."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.setblocking(False)
    try:
        dirfd = os.open(bundle, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        sock.close()
        raise FailedPrecondition(f"container bundle {bundle} is gone") from None
    try:
        path = f"/proc/self/fd/{dirfd}/{conmon.attach_path(Path('.')).name}"
        await asyncio.get_running_loop().sock_connect(sock, path)
    except OSError as e:
        sock.close()
        raise FailedPrecondition(f"cannot attach: no conmon listening ({e.strerror})") from None
    finally:
        os.close(dirfd)
    return sock


async def _output(sock: socket.socket, io: StreamIO) -> None:
    loop = asyncio.get_running_loop()
    while packet := await loop.sock_recv(sock, PACKET):
        sink = io.stdout if packet[0] == STDOUT else io.stderr if packet[0] == STDERR else None
        if sink is None and io.tty:
            sink = io.stdout
        if sink is not None and len(packet) > 1:
            await sink.write(packet[1:])


async def _input(sock: socket.socket, io: StreamIO, stdin_once: bool) -> bool:
    """Copy the client's input; True when the session should end at the client's EOF."""
    assert io.stdin is not None
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ConnectionError, BrokenPipeError):
        while data := await io.stdin.read():
            for start in range(0, len(data), INPUT_CHUNK):
                await loop.sock_sendall(sock, data[start : start + INPUT_CHUNK])
    if stdin_once:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        return False
    return True


async def _resizes(bundle: Path, io: StreamIO) -> None:
    while True:
        size = await io.resizes.get()
        with contextlib.suppress(Exception):
            conmon.resize(bundle, size.width, size.height)


async def attach(bundle: Path, io: StreamIO, *, stdin_once: bool) -> int:
    """Bridge until the container's output ends (it exited) or, for a container that
    keeps its stdin open, until the client ends its input. Returns 0."""
    sock = await connect(bundle)
    output: asyncio.Task[Any] = asyncio.create_task(_output(sock, io))
    extra: list[asyncio.Task[Any]] = []
    if io.tty:
        extra.append(asyncio.create_task(_resizes(bundle, io)))
    pending: set[asyncio.Task[Any]] = {output}
    if io.stdin is not None:
        stdin_task: asyncio.Task[Any] = asyncio.create_task(_input(sock, io, stdin_once))
        pending.add(stdin_task)
        extra.append(stdin_task)
    try:
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if output in done:
                output.result()
                return 0
            if any(task.result() for task in done):  # the client ended its input
                return 0
    finally:
        for task in (output, *extra):
            task.cancel()
        await asyncio.gather(output, *extra, return_exceptions=True)
        sock.close()
