"""Helper processes pycri starts (runtime CLIs, CNI plugins) and how they are bounded.

Each runs in its own session, so on a deadline the whole process group can be killed:
killing only the leader would leave a child holding the output pipes, and asyncio's
`Process.wait()` does not return until every pipe is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal


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
        kill_group(proc.pid)  # also when the leader is gone but a child holds a pipe
        await asyncio.shield(proc.wait())
        raise
