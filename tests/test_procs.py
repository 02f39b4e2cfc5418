"""Deadlines on helper processes: the whole process group dies and nothing is left."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from pycri import procs
from pycri.errors import DeadlineExceeded
from pycri.oci.runtime import OCIRuntime

# A "runtime" that answers nothing: a child keeps stdout open, the shell waits on it.
HANG = '#!/bin/sh\nsleep 3600 &\necho "$$ $!" > "$0.pids"\nwait\n'


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "hang"
    path.write_text(HANG)
    path.chmod(0o755)
    return path


def _gone(pids: list[int], wait: float = 10.0) -> bool:
    """Whether every pid left /proc (exited and reaped) within `wait` seconds."""
    deadline = time.monotonic() + wait
    while any(os.path.exists(f"/proc/{p}") for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def test_deadline_kills_the_group_not_only_the_leader(tmp_path: Path) -> None:
    script = _script(tmp_path)
    proc = await asyncio.create_subprocess_exec(
        script, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    # Without the group kill this never returns: `sleep` holds the pipes.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(procs.communicate(proc, b"", 0.5), 30)
    pids = [int(p) for p in Path(f"{script}.pids").read_text().split()]
    assert len(pids) == 2 and _gone(pids)  # the re-parented child is reaped too


async def test_cancel_kills_the_group(tmp_path: Path) -> None:
    script = _script(tmp_path)
    proc = await asyncio.create_subprocess_exec(
        script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    task = asyncio.create_task(procs.communicate(proc, None, 3600))
    pidfile = Path(f"{script}.pids")
    await asyncio.sleep(0.02)  # the task is inside communicate(), then:
    while not (pidfile.exists() and pidfile.read_text().strip()):
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert _gone([int(p) for p in pidfile.read_text().split()])


async def test_runtime_call_past_its_timeout_is_deadline_exceeded(tmp_path: Path) -> None:
    rt = OCIRuntime("hang", str(_script(tmp_path)), tmp_path / "root", timeout=0.5)
    with pytest.raises(DeadlineExceeded, match=r"no answer within 0.5s, killed .*runtimes.hang"):
        await asyncio.wait_for(rt.run(["state", "x"]), 30)


async def test_helpers_run_at_most_max_concurrent_at_once(tmp_path: Path) -> None:
    # Each helper counts the others running (their marker dirs) when it starts.
    script = ('mkdir "$0/$$"; ls "$0" | wc -l >> "$0.counts"; sleep 0.2; rmdir "$0/$$"')
    running = tmp_path / "running"
    running.mkdir()
    procs.set_max_concurrent(3)
    try:
        results = await asyncio.gather(*(
            procs.run(["sh", "-c", script, str(running)], stdin=None, timeout=30)
            for _ in range(12)
        ))  # fmt: skip
    finally:
        procs.set_max_concurrent(procs.DEFAULT_MAX_CONCURRENT)
    assert [rc for rc, _, _ in results] == [0] * 12
    counts = [int(n) for n in Path(f"{running}.counts").read_text().split()]
    assert len(counts) == 12 and max(counts) == 3
