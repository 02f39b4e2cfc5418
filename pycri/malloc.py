"""Keep glibc from mapping and unmapping every large buffer of a pull.

Pulling streams 1 MiB chunks through httpx, gzip/zstd and tarfile. Above
glibc's mmap threshold each chunk was a fresh mapping, faulted in page by page
and unmapped again: ~211,000 minor faults for one 200 MiB image, and half the
pull's time. Serving buffers up to 4 MiB from the heap and keeping up to 32 MiB
of freed heap measured 1.45 s → 0.79 s for that pull (hack/bench-pull.py),
and `release()` hands the freed heap back to the kernel once a pull is done, so
the daemon's resident size does not keep the pull's high-water mark.

Arenas are capped at 2: glibc's default (8 per core) gave a daemon with 500 pods 16
arenas, 15 of them for grpc's and asyncio's worker threads holding 4.1 MiB with 1.8 MiB
of it free (malloc_info); the Python side allocates under the GIL anyway, so more
arenas buy no parallelism. Idle: -0.4 MiB RSS (docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 4 * 1024 * 1024
TRIM_THRESHOLD = 32 * 1024 * 1024
ARENA_MAX = 2


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()


def tune() -> None:
    """Apply the thresholds and the arena cap (glibc only; elsewhere a no-op with a
    debug line). Called before the daemon starts its threads: an arena is bound to a
    thread on its first allocation."""
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:
        log.debug("no mallopt here; leaving the allocator as it is")
        return
    for param, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                         (M_ARENA_MAX, ARENA_MAX)):  # fmt: skip
        if mallopt(param, value) != 1:
            log.warning("mallopt(%d, %d) failed", param, value)


def release() -> None:
    """Return free heap pages to the kernel (after a pull's burst of buffers)."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)
