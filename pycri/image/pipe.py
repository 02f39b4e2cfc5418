"""A layer's bytes on their way from its download to its unpack, never on disk.

The download runs on the event loop and `put`s each chunk as it arrives; the unpack
runs in a thread of its own (`own_thread`) and reads the same bytes as a file. At
most `limit` bytes wait between the two: a download faster than the disk waits for
room (without a thread blocked on it), and an unpack faster than the network waits
for bytes. Either side can end the other: the download `fail`s the pipe (the unpack
stops at its next read and removes what it made), and an unpack that stopped `close`s
it (the download goes on only to verify its digest, see ImagePull._stream_layer).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Aborted(Exception):
    """What the unpack's read raises once the download has failed or was cancelled:
    the unpack removes its work and ends; the download's own error is the pull's."""


class Pipe:
    """A bounded, thread-safe byte queue with a file's `read` on the reading side."""

    def __init__(self, limit: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._limit = limit
        self._ready = threading.Condition()
        self._chunks: deque[memoryview] = deque()
        self._buffered = 0
        self._eof = False
        self._error: BaseException | None = None
        self._closed = False
        self._room = asyncio.Event()
        self._room.set()
        self.taken = 0  # bytes the unpack has read: the pull's progress on disk

    # The download's side, on the event loop.

    async def put(self, data: bytes) -> bool:
        """Queue `data` once there is room; False (nothing queued) if the reader is gone."""
        while True:
            with self._ready:
                if self._closed:
                    return False
                if self._buffered < self._limit:
                    self._chunks.append(memoryview(data))
                    self._buffered += len(data)
                    self._ready.notify()
                    return True
                self._room.clear()  # under the lock: a read after this sets it again
            await self._room.wait()

    def finish(self) -> None:
        """The end of the stream: the reader gets b"" once it has read what is queued."""
        with self._ready:
            self._eof = True
            self._ready.notify()

    def fail(self, error: BaseException) -> None:
        """The reader's next read raises `error`; what is queued is dropped."""
        with self._ready:
            self._error = error
            self._chunks.clear()
            self._buffered = 0
            self._ready.notify()

    @property
    def closed(self) -> bool:
        return self._closed

    # The unpack's side, in its thread.

    def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (all that is queued for n < 0), blocking until there is at
        least one; b"" only at the end of the stream."""
        out = bytearray(self._wait() if n < 0 else n)
        return bytes(out[: self.readinto(out)])

    def readinto(self, buf: memoryview | bytearray) -> int:
        """Fill `buf` from what is queued (blocking until there is something): each
        byte is copied once, from the chunk it came in. 0 only at the end."""
        want = len(buf)
        with self._ready:
            got = 0
            if want and self._wait_locked():
                while self._chunks and got < want:
                    chunk = self._chunks.popleft()
                    n = min(len(chunk), want - got)
                    buf[got : got + n] = chunk[:n]
                    got += n
                    if n < len(chunk):
                        self._chunks.appendleft(chunk[n:])
                self._buffered -= got
                self.taken += got
        if got:
            self._loop.call_soon_threadsafe(self._room.set)
        return got

    def _wait(self) -> int:
        with self._ready:
            return self._buffered if self._wait_locked() else 0

    def _wait_locked(self) -> bool:
        """Wait for bytes or the end; True if there are bytes. Raises the failure."""
        while not self._chunks and not self._eof and self._error is None:
            self._ready.wait()
        if self._error is not None:
            raise self._error
        return bool(self._chunks)

    def close(self) -> None:
        """The reader is done (finished or failed): a waiting `put` returns False."""
        with self._ready:
            self._closed = True
            self._chunks.clear()
            self._buffered = 0
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._room.set)


async def own_thread(fn: Callable[[], T], name: str) -> T:
    """Run `fn` in a new thread and await its result. Not the default executor: an
    unpack waits on its download for as long as the download lasts, and a handful of
    such waits would take every executor thread from the calls the download needs.
    Cancelled, it still waits for `fn` to end (the caller makes it end: `Pipe.fail`)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = fn()
        except BaseException as e:
            loop.call_soon_threadsafe(settle, None, e)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        await asyncio.wait([done])
        done.exception()  # its error, if any, is the cancel's consequence: not reported
        raise
