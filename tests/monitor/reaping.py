"""Reaper scenarios, each run as its own process by tests/monitor/test_reaper.py.

A scenario makes this process a child subreaper and sweeps every child nobody
watches, which must not happen to pytest's own children; so each runs here and
prints what it saw as JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pycri import procs
from pycri.monitor import reaper as reaper_mod
from pycri.monitor.reaper import Reaper
from tests.monitor.starter import children, ppid_of, zombie_children

# Prints the pid of a grandchild that is re-parented to us at once and exits later.
ORPHAN = "( sleep {delay} </dev/null >/dev/null 2>&1 & echo $! )"


class Warnings(logging.Handler):
    """Collects warnings: a stolen exit status is logged as one."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def state_of(pid: int) -> str:
    """'Z' for a zombie, '' once reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


async def until(pred: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def orphan(delay: float) -> int:
    rc, out, _ = await procs.run(["sh", "-c", ORPHAN.format(delay=delay)], stdin=None,
                                 timeout=30)  # fmt: skip
    assert rc == 0
    return int(out)


async def grandchild(reaper: Reaper) -> dict[str, Any]:
    """An orphan re-parented to us is reaped by the sweep, no SIGCHLD handler involved."""
    pid = await orphan(0.3)
    reparented = ppid_of(pid) == os.getpid()
    reaped = await until(lambda: state_of(pid) == "")
    return {
        "reparented": reparented,
        "reaped": reaped,
        "sigchld_default": signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL,
        "pidfd_watcher": isinstance(asyncio.get_child_watcher(), reaper_mod.ChildWatcher),
    }


async def no_steal(reaper: Reaper) -> dict[str, Any]:
    """Hundreds of awaited children (each leaving an orphan) while the sweep runs all
    the time: every child reports its own exit code, and so does a watched re-parented
    process whose pid we learn only after it was re-parented."""
    warnings = Warnings()
    logging.getLogger().addHandler(warnings)
    logging.getLogger("asyncio").addHandler(warnings)

    async def child(i: int) -> int:
        script = f"( sleep 0.0{i % 10} </dev/null >/dev/null 2>&1 & ); exit {i % 256}"
        rc, _, _ = await procs.run(["sh", "-c", script], stdin=None, timeout=60)
        return rc

    async def watched() -> int | None:
        with reaper.expecting():
            rc, out, _ = await procs.run(
                ["sh", "-c", "( sh -c 'sleep 0.2; exit 7' </dev/null >/dev/null 2>&1 & echo $! )"],
                stdin=None, timeout=30,
            )  # fmt: skip
            assert rc == 0
            pid = int(out)
            await asyncio.sleep(0.3)  # long exited (a zombie) by now, and not swept
            reaper.watch(pid)
        return await reaper.status(pid)

    count = 300
    results = await asyncio.gather(watched(), *(child(i) for i in range(count)))
    status = results[0]
    codes = results[1:]
    wrong = [i for i, rc in enumerate(codes) if rc != i % 256]
    await until(lambda: not children(), 10)  # every orphan exited and reaped
    return {
        "wrong": wrong,
        "count": len(codes),
        "watched_code": None if status is None else os.waitstatus_to_exitcode(status),
        "warnings": warnings.messages,
        "zombies": zombie_children(),
    }


async def exited_pid(reaper: Reaper) -> dict[str, Any]:
    """A pidfd opened for a child that already exited gets its status; for a pid
    already reaped, the watch ends at once with no status."""
    zombie = os.posix_spawn("/bin/sh", ["sh", "-c", "exit 3"], dict(os.environ))
    await until(lambda: state_of(zombie) == "Z")
    status = await asyncio.wait_for(reaper.status(zombie), 5)
    gone = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    os.waitpid(gone, 0)
    return {
        "zombie_code": None if status is None else os.waitstatus_to_exitcode(status),
        "zombie_reaped": state_of(zombie) == "",
        "gone_status": await asyncio.wait_for(reaper.status(gone), 5),
    }


async def hold(reaper: Reaper) -> dict[str, Any]:
    """While a hold is open, zombies first seen after it began are left alone (one may
    be the held process); one seen before a later hold began is swept despite it."""
    first = reaper.expecting()
    first.__enter__()
    a = await orphan(0)
    await until(lambda: state_of(a) == "Z", 5)
    await asyncio.sleep(0.3)  # many sweeps
    a_kept = state_of(a) == "Z"
    with reaper.expecting():  # began after `a` was seen
        first.__exit__(None, None, None)
        a_reaped = await until(lambda: state_of(a) == "", 5)
        b = await orphan(0)
        await until(lambda: state_of(b) == "Z", 5)
        await asyncio.sleep(0.3)  # many sweeps
        b_kept = state_of(b) == "Z"
    b_reaped = await until(lambda: state_of(b) == "", 5)
    return {"a_kept": a_kept, "a_reaped_in_later_hold": a_reaped, "b_kept": b_kept,
            "b_reaped": b_reaped}  # fmt: skip


async def threaded(reaper: Reaper) -> dict[str, Any]:
    """Blocking subprocess calls in worker threads (children in the daemon's own process
    group that asyncio does not know) keep their exit statuses: the sweep gives such a
    zombie one interval for its owner. Orphans exit all the while."""

    def call(i: int) -> int:
        return subprocess.run(["sh", "-c", f"exit {i % 100}"], timeout=30,
                              check=False).returncode  # fmt: skip

    async def orphans() -> None:
        for _ in range(100):
            await orphan(0)

    results = await asyncio.gather(orphans(), *(asyncio.to_thread(call, i) for i in range(200)))
    codes = results[1:]
    await until(lambda: not children(), 10)  # every orphan exited and reaped
    return {"wrong": [i for i, rc in enumerate(codes) if rc != i % 100],
            "zombies": zombie_children()}  # fmt: skip


SCENARIOS: dict[str, tuple[float, Callable[[Reaper], Awaitable[dict[str, Any]]]]] = {
    "grandchild": (0.05, grandchild),
    "no_steal": (0.001, no_steal),
    "exited_pid": (3600.0, exited_pid),  # no sweep may take the zombie first
    "hold": (0.01, hold),
    "threaded": (0.05, threaded),
}


async def main(name: str) -> dict[str, Any]:
    interval, scenario = SCENARIOS[name]
    reaper = Reaper(interval=interval)
    reaper.start()
    try:
        return await scenario(reaper)
    finally:
        reaper.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
