#!/usr/bin/env python3
"""Hundreds of short helpers at once, the old way against pycri's (issue 16).

old: a SIGCHLD handler on the loop, asyncio's default (threaded) child watcher and
every fork at once, as recovery did with one `runtime state` per container;
new: `procs.run` (bounded by helpers.max_concurrent) under the pidfd `Reaper`.
Prints wall time, the worst stall of a 10 ms ticker on the loop, and how many
"wakeup fd" warnings the interpreter printed. Run with the venv, from the repository:
    hack/child-burst.py old -- runc --root /tmp/r state x
    hack/child-burst.py [--max-concurrent N] new -- runc --root /tmp/r state x
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
import time

from pycri import procs
from pycri.monitor.reaper import Reaper


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(0.01)
        lags.append(loop.time() - t - 0.01)


async def _old_one(argv: list[str]) -> int:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    await proc.communicate()
    return proc.returncode or 0


async def _new_one(argv: list[str]) -> int:
    rc, _, _ = await procs.run(argv, stdin=None, timeout=60)
    return rc


async def _run(mode: str, count: int, argv: list[str]) -> str:
    loop = asyncio.get_running_loop()
    if mode == "old":
        loop.add_signal_handler(signal.SIGCHLD, lambda: None)
        one = _old_one
    else:
        Reaper().start()
        one = _new_one
    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(_ticker(lags, stop))
    start = time.perf_counter()
    codes = await asyncio.gather(*(one(argv) for _ in range(count)))
    wall = time.perf_counter() - start
    stop.set()
    await tick
    return (f"{mode}: {count} x {' '.join(argv)} in {wall:.2f} s, worst loop stall "
            f"{max(lags) * 1000:.0f} ms, {codes.count(0)} exited 0")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["old", "new"])
    ap.add_argument("--count", type=int, default=450)
    ap.add_argument("--max-concurrent", type=int, default=procs.DEFAULT_MAX_CONCURRENT)
    ap.add_argument("argv", nargs="*", default=["true"])
    args = ap.parse_args()
    procs.set_max_concurrent(args.max_concurrent)
    # The interpreter writes its wakeup-fd warnings to fd 2: count them in a file.
    with tempfile.TemporaryFile() as err:
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            line = asyncio.run(_run(args.mode, args.count, args.argv))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        warnings = err.read().count(b"wakeup fd")
    print(f"{line}, {warnings} wakeup-fd warnings")


if __name__ == "__main__":
    main()
