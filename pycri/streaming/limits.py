"""Counters that bound what the streaming port may hold, shared by all its sessions.

The port is unauthenticated until a request names a valid token, so everything a
connection can make pycri hold (file descriptors above all) is counted here and
refused past a fixed budget instead of growing until the CRI socket cannot accept.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time

# The largest frame (SPDY) or message (WebSocket) a peer may send: client-go writes 32 KiB
# of data at a time and small control payloads, so anything bigger is an attack on our
# memory, and the session is closed saying so.
MAX_FRAME = 1 << 20
# How long a read loop parses and dispatches frames before it lets the event loop run
# the other tasks: a peer sending tiny frames as fast as it can then delays the CRI
# calls by this much per turn of the loop, not by a whole read's worth of frames.
SLICE = 0.001
# The share of the event loop's time all streaming read loops together may take while
# they are busy: past it they sleep, however many connections flood at once, so the CRI
# calls always have the rest.
SHARE = 0.5
# Control frames (WebSocket pings and pongs; SPDY PING, SETTINGS, WINDOW_UPDATE, HEADERS
# and the like) one connection may send at once, and then per second: each is parsed
# and a ping answered, while an honest client sends a few per minute. Past it the
# connection is closed.
CONTROL_BURST = 1000
CONTROL_RATE = 1000.0


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


class Share:
    """A token bucket of event-loop time, shared by every read loop of the process (one
    event loop): `charge` takes the work just done and says how long to sleep to stay
    within `fraction` of the time."""

    def __init__(self, fraction: float = SHARE, burst: float = SLICE) -> None:
        self.fraction = fraction
        self.burst = burst
        self._tokens = burst
        self._at = time.monotonic()

    def charge(self, seconds: float) -> float:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.fraction)
        self._at = now
        self._tokens -= seconds
        return max(0.0, -self._tokens / self.fraction)


LOOP_SHARE = Share()


class Pacer:
    """Makes a read loop give the event loop back after every SLICE of its own work, and
    sleep while the read loops together are over their SHARE."""

    def __init__(self, share: Share = LOOP_SHARE, slice_seconds: float = SLICE) -> None:
        self.share = share
        self.slice = slice_seconds
        self._since = time.monotonic()

    def restart(self) -> None:
        """The read loop got new input (it usually waited for it): its work starts now."""
        self._since = time.monotonic()

    async def tick(self) -> None:
        """Called after each frame; yields once the slice is used up. What is charged is
        the time since the last yield or input, at most two slices: the loop may have
        waited in between (for room in a buffer, for a write), and that was not work."""
        worked = time.monotonic() - self._since
        if worked >= self.slice:
            await asyncio.sleep(self.share.charge(min(worked, 2 * self.slice)))
            self._since = time.monotonic()


class Rate:
    """A token bucket: `take` says whether one more event fits, `burst` at once and
    `per_second` on average."""

    def __init__(self, per_second: float = CONTROL_RATE, burst: int = CONTROL_BURST) -> None:
        self.per_second = per_second
        self.burst = burst
        self._tokens = float(burst)
        self._at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_second)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


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
