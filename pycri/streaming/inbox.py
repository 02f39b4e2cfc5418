"""What a streaming connection received and the application has not read yet.

A peer chooses how it frames its bytes: one 32 KiB message or 32,768 one-byte ones. So
each stream or channel keeps its unread bytes in one buffer, never one object per
message or frame (a queued 2-byte `bytes` costs 56 bytes of Python objects, which let
1 MiB of tiny messages hold 28 MiB), and what it holds is what its bounds count: the
payload bytes. Past its own bound, its connection's or the server's (all connections
together), the read loop waits, and TCP pushes back on the peer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

# Received bytes one stream or channel may hold unread.
MAX_STREAM_BUFFER = 1 << 20
# The same for all of a connection's streams together, so many streams cannot multiply it.
MAX_SESSION_BUFFER = 16 << 20
# The most one read hands the application (a pipe's or a socket buffer's worth).
MAX_READ = 64 * 1024
# How often a connection whose input waits for room is asked whether its peer is there.
PROBE_EVERY = 2.0


class Pool:
    """The unread bytes of one connection's inboxes, bounded together; and, as a
    connection pool's `parent`, of every connection of the server (a daemon-wide budget,
    so many connections cannot multiply the per-connection bound either)."""

    def __init__(self, limit: int = MAX_SESSION_BUFFER, parent: Pool | None = None,
                 peer_alive: Callable[[], Awaitable[bool]] | None = None) -> None:
        """`peer_alive`: asked every PROBE_EVERY seconds while a `put` waits for room (the
        connection's read loop, parked, would not see its peer hang up): once it says
        no, the waiting input is dropped, the read loop reads on to the end, and the
        connection's input is given back."""
        self.limit = limit
        self.used = 0
        self.closed = False
        self.peer_gone = False
        self.parent = parent
        self._peer_alive = peer_alive
        self._space = asyncio.Event()
        self._waiting: set[Pool] = set()  # children waiting for room here

    def fits(self, size: int) -> bool:
        """Whether `size` more bytes fit here and in the parent; an empty pool takes any
        size, so nothing waits for ever."""
        here = not self.used or self.used + size <= self.limit
        return here and (self.parent is None or self.parent.fits(size))

    def take(self, size: int) -> None:
        self.used += size
        if self.parent is not None:
            self.parent.take(size)

    def close(self) -> None:
        """The connection is over: nothing waits for room any more. What its inboxes
        still hold stays counted, here and in the parent, until it is read or dropped,
        or `release`d."""
        self.closed = True
        self.wake()

    def release(self) -> None:
        """The application is done with the connection: what its inboxes still hold goes
        with them, and the parent stops counting it."""
        self.close()
        if self.parent is not None:
            self.parent.give(self.used)
            self.parent = None

    def wake(self) -> None:
        """Room was made, or an inbox ended: a `put` waiting looks again (a child's too)."""
        self._space.set()
        for child in list(self._waiting):
            child.wake()

    def give(self, size: int) -> None:
        self.used -= size
        if self.parent is not None:
            self.parent.give(size)
        self.wake()

    async def wait(self) -> None:
        self._space.clear()
        parent = self.parent
        if parent is not None:
            parent._waiting.add(self)
        try:
            await asyncio.wait_for(self._space.wait(), PROBE_EVERY)
        except TimeoutError:
            if self._peer_alive is not None and not await self._peer_alive():
                self.peer_gone = True
        finally:
            if parent is not None:
                parent._waiting.discard(self)


class Inbox:
    """The unread input of one stream or channel: `put` by the read loop, `read` by the
    application until b"" (after `end`)."""

    def __init__(self, pool: Pool, limit: int = MAX_STREAM_BUFFER) -> None:
        self.pool = pool
        self.limit = limit
        self.ended = False
        self._buf = bytearray()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._buf)

    def would_wait(self, size: int) -> bool:
        """Whether a `put` of `size` bytes would wait for room now."""
        return bool(self._buf and len(self._buf) + size > self.limit) or not self.pool.fits(size)

    async def put(self, data: bytes) -> None:
        """Append `data` once it fits in this inbox and in the pool (an empty one takes
        it whatever its size, so nothing waits for ever); dropped once the input ended."""
        if not data:
            return
        pool = self.pool
        while not self.ended and not pool.closed and not pool.peer_gone and \
                self.would_wait(len(data)):
            await pool.wait()
        if self.ended or pool.peer_gone:
            return
        self._buf += data
        pool.take(len(data))
        self._ready.set()

    async def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (MAX_READ at most); b"" once the input ended and all was read."""
        while not self._buf and not self.ended:
            self._ready.clear()
            await self._ready.wait()
        size = min(n, MAX_READ) if n > 0 else MAX_READ
        if size >= len(self._buf):
            chunk = bytes(self._buf)
            self._buf.clear()
        else:
            chunk = bytes(self._buf[:size])
            del self._buf[:size]
        self.pool.give(len(chunk))
        return chunk

    def end(self) -> None:
        """No more input: what is left can still be read, then b""; a `put` waiting for
        room gives up."""
        self.ended = True
        self._ready.set()
        self.pool.wake()

    def discard(self) -> None:
        """Drop what was never read (nobody will): freed before the pool hears of it."""
        size = len(self._buf)
        self._buf.clear()
        self.pool.give(size)
