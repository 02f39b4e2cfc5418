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


# A helper that prints without end on one stream and leaves a child printing too.
FLOOD = ('#!/bin/sh\necho "$$" > "$0.pids"\nyes flood >&{fd} &\necho "$!" >> "$0.pids"\n'
         'exec yes >&{fd}\n')


@pytest.mark.parametrize(("fd", "stream"), [(1, "stdout"), (2, "stderr")])
async def test_output_past_the_bound_kills_the_helper(tmp_path: Path, fd: int,
                                                      stream: str) -> None:
    """Issue 41: a CNI plugin's 512 MiB of stdout was buffered whole before its 1 MiB
    limit applied (RSS +1 GB). Now reading stops at the bound, the group dies, and no
    more than the bound (plus a chunk) was ever held."""
    import tracemalloc

    path = tmp_path / "flood"
    path.write_text(FLOOD.format(fd=fd))
    path.chmod(0o755)
    tracemalloc.start()
    try:
        with pytest.raises(procs.OutputTooLarge, match=f"more than 1 MiB on {stream}"):
            await procs.run([str(path)], stdin=b"{}", timeout=60, max_output=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes held for a 1 MiB bound"
    pids = [int(p) for p in (tmp_path / "flood.pids").read_text().split()]
    assert _gone(pids), f"flood left running: {pids}"


async def test_output_up_to_the_bound_and_unread_stdin_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "print"
    path.write_text("#!/bin/sh\nhead -c 1048576 /dev/zero\necho oops >&2\nexit 3\n")
    path.chmod(0o755)
    rc, out, err = await procs.run([str(path)], stdin=b"x" * (4 << 20), timeout=60,
                                   max_output=1 << 20)
    assert (rc, len(out), err) == (3, 1 << 20, b"oops\n")
