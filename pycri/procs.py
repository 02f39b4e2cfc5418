"""Helper processes pycri starts (runtime CLIs, CNI plugins, conmon) and how they are bounded.

At most `helpers.max_concurrent` run at once (`slot`): recovery or a burst of RPCs
used to fork hundreds of runtime calls on the loop in one go, and their exits came
back as a storm (issue 16). A runtime call or plugin holds its slot until it exits;
a long-lived process (an ExecSync's conmon) only while it is being started.

Each runs in its own session, so on a deadline the whole process group can be killed:
killing only the leader would leave a child holding the output pipes, and asyncio's
`Process.wait()` does not return until every pipe is closed. pycri is a child
subreaper, so the killed group's other members are re-parented to it; the daemon's
`Reaper` sweep reaps them (monitor/reaper.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence

DEFAULT_MAX_CONCURRENT = 16

_max_concurrent = DEFAULT_MAX_CONCURRENT
# One semaphore per event loop: an asyncio.Semaphore belongs to the loop it first waits on.
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def set_max_concurrent(n: int) -> None:
    """Bound the helper processes running at once (`helpers.max_concurrent`)."""
    global _max_concurrent
    _max_concurrent = n
    _slots.clear()


@contextlib.asynccontextmanager
async def slot() -> AsyncIterator[None]:
    """Hold one of the `max_concurrent` places for a helper process."""
    loop = asyncio.get_running_loop()
    sem = _slots.get(loop)
    if sem is None:
        sem = _slots[loop] = asyncio.Semaphore(_max_concurrent)
    async with sem:
        yield


async def run(
    argv: Sequence[str],
    *,
    stdin: bytes | None,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> tuple[int, bytes, bytes]:
    """Run a helper in its own session within a slot; (exit code, stdout, stderr).
    Past `timeout` (TimeoutError) or on cancellation its process group is killed."""
    async with slot():
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        out, err = await communicate(proc, stdin, timeout)
    assert proc.returncode is not None
    return proc.returncode, out, err


def kill_group(pgid: int) -> None:
    """SIGKILL a process group pycri made (its leader's pid is its id); gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


async def communicate(
    proc: asyncio.subprocess.Process, stdin: bytes | None, timeout: float
) -> tuple[bytes, bytes]:
    """`proc.communicate` within `timeout`. On expiry (TimeoutError) or cancellation the
    process group of `proc` (started with start_new_session=True) is killed and reaped
    before the exception propagates."""
    try:
        return await asyncio.wait_for(proc.communicate(stdin), timeout)
    except BaseException:
        await kill_and_reap(proc)
        raise


async def kill_and_reap(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL `proc` with its process group (also when the leader is gone but a child
    holds a pipe) and wait for it; the members it leaves behind go to the sweep."""
    kill_group(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()  # in case it is not its group's leader
    await asyncio.shield(proc.wait())
