"""Non-blocking reads and writes on raw fds (pipes, a pty master) from the event loop.

asyncio's pipe transports cannot be told that EIO on a pty master means "the other
side hung up", and writing to a pipe must be able to wait; these helpers do just that.
"""

from __future__ import annotations

import asyncio
import errno
import os

CHUNK = 32 * 1024


async def _ready(fd: int, writable: bool) -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    if writable:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await fut
    finally:
        if writable:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


async def read(fd: int, size: int = CHUNK) -> bytes:
    """Up to `size` bytes; b"" at end of file (EIO on a pty whose slave side closed)."""
    while True:
        try:
            return os.read(fd, size)
        except BlockingIOError:
            await _ready(fd, writable=False)
        except OSError as e:
            if e.errno == errno.EIO:
                return b""
            raise


async def write_all(fd: int, data: bytes) -> None:
    """Write everything; BrokenPipeError when the reader is gone."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            await _ready(fd, writable=True)
            continue
        except OSError as e:
            if e.errno == errno.EIO:
                raise BrokenPipeError(errno.EPIPE, "terminal closed") from None
            raise
        view = view[n:]
