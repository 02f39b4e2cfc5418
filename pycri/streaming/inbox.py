"""What a streaming connection received and the application has not read yet.

A peer chooses how it frames its bytes: one 32 KiB message or 32,768 one-byte ones. So
each stream or channel keeps its unread bytes in one buffer, never one object per
message or frame (a queued 2-byte `bytes` costs 56 bytes of Python objects, which let
1 MiB of tiny messages hold 28 MiB), and what it holds is what its bounds count: the
payload bytes. Past its own bound, or its connection's, the read loop waits, and TCP
pushes back on the peer.
"""

from __future__ import annotations

import asyncio

# Received bytes one stream or channel may hold unread.
MAX_STREAM_BUFFER = 1 << 20
# The same for all of a connection's streams together, so many streams cannot multiply it.
MAX_SESSION_BUFFER = 16 << 20
# The most one read hands the application (a pipe's or a socket buffer's worth).
MAX_READ = 64 * 1024


class Pool:
    """The unread bytes of one connection's inboxes, bounded together."""

    def __init__(self, limit: int = MAX_SESSION_BUFFER) -> None:
        self.limit = limit
        self.used = 0
        self.closed = False
        self._space = asyncio.Event()

    def close(self) -> None:
        """The connection is over: nothing waits for room any more."""
        self.closed = True
        self.wake()

    def wake(self) -> None:
        """Room was made, or an inbox ended: a `put` waiting looks again."""
        self._space.set()

    def give(self, size: int) -> None:
        self.used -= size
        self.wake()

    async def wait(self) -> None:
        self._space.clear()
        await self._space.wait()


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

    async def put(self, data: bytes) -> None:
        """Append `data` once it fits in this inbox and in the pool (an empty one takes
        it whatever its size, so nothing waits for ever); dropped once the input ended."""
        if not data:
            return
        pool = self.pool
        while not self.ended and not pool.closed and (
            (self._buf and len(self._buf) + len(data) > self.limit)
            or (pool.used and pool.used + len(data) > pool.limit)
        ):
            await pool.wait()
        if self.ended:
            return
        self._buf += data
        pool.used += len(data)
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
        """Drop what was never read (nobody will)."""
        self.pool.give(len(self._buf))
        self._buf.clear()
