"""Counters that bound what the streaming port may hold, shared by all its sessions.

The port is unauthenticated until a request names a valid token, so everything a
connection can make pycri hold (file descriptors above all) is counted here and
refused past a fixed budget instead of growing until the CRI socket cannot accept.
"""

from __future__ import annotations

import logging
import resource
import time

# The largest frame (SPDY) or message (WebSocket) a peer may send: client-go writes 32 KiB
# of data at a time and small control payloads, so anything bigger is an attack on our
# memory, and the session is closed saying so.
MAX_FRAME = 1 << 20


class Budget:
    """A fixed number of units (file descriptors) that callers take and give back."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def take(self, n: int = 1) -> bool:
        """Take `n` units if they are free; False (nothing taken) if not."""
        if self.used + n > self.total:
            return False
        self.used += n
        return True

    def give(self, n: int = 1) -> None:
        self.used = max(0, self.used - n)

    @property
    def free(self) -> int:
        return self.total - self.used


def fd_budget(max_fds: int, reserve: int) -> int:
    """How many fds streaming may hold: `max_fds`, but never eating into the `reserve`
    the daemon keeps for its CRI socket, database, runtimes and pulls (half the limit
    when the limit is smaller than the reserve)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_fds
    return max(1, min(max_fds, max(soft - reserve, soft // 2)))


class RateLimitedLog:
    """Log a recurring condition at most once per `interval`, with how often it recurred."""

    def __init__(self, logger: logging.Logger, interval: float = 60.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, message: str) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        self._last[key] = now
        extra = self._suppressed.pop(key, 0)
        suffix = f" ({extra} more like this in the last {self.interval:.0f}s)" if extra else ""
        self.logger.warning("%s%s", message, suffix)
