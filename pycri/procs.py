"""Helper processes pycri starts (runtime CLIs, CNI plugins) and how they are bounded.

Each runs in its own session, so on a deadline the whole process group can be killed:
killing only the leader would leave a child holding the output pipes, and asyncio's
`Process.wait()` does not return until every pipe is closed.

pycri is a child subreaper, so the killed group's other members are re-parented to
it and would stay zombies: their group is remembered and reaped (on SIGCHLD, by the
daemon's Reaper) until a grace period has passed with no child of it left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

# How long a killed group is reaped for: its members are re-parented to us only as
# their parents die, so "no child in the group" right after the kill proves nothing.
ORPHAN_GRACE = 10.0

_orphan_groups: dict[int, float] = {}  # pgid -> monotonic time after which it is dropped


def kill_group(pgid: int) -> None:
    """SIGKILL a process group pycri made (its leader's pid is its id); gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def reap_orphans_of(pgid: int) -> None:
    """Reap the zombies group `pgid` leaves us, now and on later SIGCHLDs. Only for a
    group whose leader has been waited for (its status belongs to asyncio)."""
    _orphan_groups[pgid] = time.monotonic() + ORPHAN_GRACE
    reap_orphans()


def reap_orphans() -> None:
    """waitpid every exited member of the remembered groups (called on SIGCHLD)."""
    now = time.monotonic()
    for pgid, until in list(_orphan_groups.items()):
        while True:
            try:
                pid, _ = os.waitpid(-pgid, os.WNOHANG)
            except ChildProcessError:
                if now > until:
                    del _orphan_groups[pgid]
                break
            if pid == 0:
                break


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
    holds a pipe), wait for it, and reap what the group leaves us."""
    kill_group(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()  # in case it is not its group's leader
    await asyncio.shield(proc.wait())
    reap_orphans_of(proc.pid)
