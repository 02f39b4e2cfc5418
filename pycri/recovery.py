"""Serve first, recheck after: what a restart does once the socket answers.

At start the managers only load their records (no process, no runtime call), and the
socket serves from them at once, however many pods and containers there are. The
recheck then learns each object's real state in the background: conmon's exit file,
the bundle, and the process itself named by pid and start time (`monitor/probe.py`),
read in worker threads a batch at a time, each result applied as soon as it is read.
The OCI runtime is asked (`state`) only where those facts are not conclusive, a few
calls at a time. Until an object is rechecked, RPCs answer from its record; every
change the recheck makes goes through the object's lock and is dropped if an RPC
changed the record meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
P = TypeVar("P")

PROBE_BATCH = 64  # records probed per worker-thread hop
RUNTIME_CALLS = 4  # OCI runtime calls the recheck makes at once


class Rechecked(Protocol):
    """A manager whose records the recheck confirms."""

    unchecked: set[str]  # IDs whose state is not rechecked yet

    async def recheck(self, runtime_calls: asyncio.Semaphore) -> None: ...


async def probed(
    items: Sequence[T], probe: Callable[[T], P]
) -> AsyncIterator[tuple[T, P | Exception]]:
    """(item, probe(item)) for each item, probed in a worker thread a batch at a time, so
    no file read happens on the event loop and each result is used as soon as its batch
    is read. A probe that fails yields its exception, and the others go on."""
    for i in range(0, len(items), PROBE_BATCH):
        batch = items[i : i + PROBE_BATCH]
        results = await asyncio.to_thread(_each, probe, batch)
        for pair in zip(batch, results, strict=True):
            yield pair


def _each(probe: Callable[[T], P], batch: Sequence[T]) -> list[P | Exception]:
    out: list[P | Exception] = []
    for x in batch:
        try:
            out.append(probe(x))
        except Exception as e:
            out.append(e)
    return out


class Recovery:
    """Runs the recheck of every manager once, and says how far it got (Status verbose)."""

    def __init__(self, managers: Sequence[Rechecked]) -> None:
        self.managers = managers
        self.done_at = 0  # ns since the epoch; 0 while the recheck runs

    async def run(self) -> None:
        t0 = time.monotonic()
        total = self.pending
        runtime_calls = asyncio.Semaphore(RUNTIME_CALLS)
        results = await asyncio.gather(*(m.recheck(runtime_calls) for m in self.managers),
                                       return_exceptions=True)
        for failure in results:
            if isinstance(failure, Exception):
                log.error("recheck failed: %s", failure, exc_info=failure)
        self.done_at = time.time_ns()
        log.info("recheck of %d pods and containers done in %.2fs (%d left unchecked)",
                 total, time.monotonic() - t0, self.pending)

    @property
    def pending(self) -> int:
        return sum(len(m.unchecked) for m in self.managers)

    def info(self) -> dict[str, Any]:
        return {"pending": self.pending, "doneAt": self.done_at}
