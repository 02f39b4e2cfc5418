"""Worker threads that a cancelled pull waits for.

Cancelling `asyncio.to_thread` abandons the thread, not the work: a layer would go on
unpacking, or a chunk on being written, after the pull that started it had cleaned up,
and land in the store with nobody to account for it. `run` stops the thread and waits.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Stopped(Exception):
    """Raised in a worker that saw its stop event; the caller reports the cancellation."""


async def run(fn: Callable[..., T], *args: Any, stop: threading.Event | None = None) -> T:
    """`fn(*args)` in a worker thread. Cancelled: set `stop` if given (fn checks it between
    steps and raises Stopped, cleaning up as on any error), wait for the thread, go on."""
    job = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        if stop is not None:
            stop.set()
        await asyncio.wait([job])
        if not job.cancelled():
            job.exception()  # retrieved: the cancellation is what is reported
        raise
