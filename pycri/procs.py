"""Helper processes pycri starts (runtime CLIs, CNI plugins, conmon) and how they are bounded.

At most `helpers.max_concurrent` run at once (`slot`): recovery or a burst of RPCs
used to fork hundreds of runtime calls on the loop in one go, and their exits came
back as a storm (issue 16). A runtime call or plugin holds its slot until it exits;
a long-lived process (an ExecSync's conmon) only while it is being started.

What a helper prints is read with a bound that holds while reading (`max_output` per
stream, `OutputTooLarge` past it, the helper killed): a CNI plugin printing 512 MiB
used to be buffered whole before the plugin's 1 MiB limit was applied (issue 41).

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
from typing import Any

DEFAULT_MAX_CONCURRENT = 16
# Per stream: a runtime's `state` or `features` is a few KiB, a CNI result less (the
# network code asks for 1 MiB).
DEFAULT_MAX_OUTPUT = 4 << 20
_CHUNK = 64 << 10
_DRAIN_SECONDS = 5.0


class OutputTooLarge(OSError):
    """A helper printed more than its bound on one stream; it has been killed. An
    OSError, so that callers treating a helper they cannot run as such see it too."""

    def __init__(self, stream: str, limit: int) -> None:
        self.stream, self.limit = stream, limit
        super().__init__(f"printed more than {_size(limit)} on {stream}, killed")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"

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
    max_output: int = DEFAULT_MAX_OUTPUT,
) -> tuple[int, bytes, bytes]:
    """Run a helper in its own session within a slot; (exit code, stdout, stderr).
    Past `timeout` (TimeoutError), past `max_output` bytes on a stream (OutputTooLarge)
    or on cancellation its process group is killed."""
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
        out, err = await communicate(proc, stdin, timeout, max_output)
    assert proc.returncode is not None
    return proc.returncode, out, err


def kill_group(pgid: int) -> None:
    """SIGKILL a process group pycri made (its leader's pid is its id); gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


async def communicate(
    proc: asyncio.subprocess.Process, stdin: bytes | None, timeout: float,
    max_output: int = DEFAULT_MAX_OUTPUT,
) -> tuple[bytes, bytes]:
    """`proc.communicate` within `timeout`, each stream read to at most `max_output`
    bytes. On expiry (TimeoutError), a stream past its bound (OutputTooLarge) or
    cancellation the process group of `proc` (started with start_new_session=True) is
    killed and reaped before the exception propagates."""
    reads = [asyncio.ensure_future(_read(proc.stdout, "stdout", max_output)),
             asyncio.ensure_future(_read(proc.stderr, "stderr", max_output))]
    tasks: list[asyncio.Future[Any]] = [*reads, asyncio.ensure_future(_feed(proc.stdin, stdin))]
    try:
        async with asyncio.timeout(timeout):
            await asyncio.gather(*tasks)
            await proc.wait()
        return reads[0].result(), reads[1].result()
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        kill_group(proc.pid)
        # A stream left unread past its buffer has paused its pipe, and a paused pipe
        # never sees its end: wait() would not return. Read what is left, into nothing.
        await asyncio.shield(_discard(proc))
        await kill_and_reap(proc)
        raise


async def _read(reader: asyncio.StreamReader | None, stream: str, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while reader is not None and (chunk := await reader.read(_CHUNK)):
        size += len(chunk)
        if size > limit:
            raise OutputTooLarge(stream, limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def _discard(proc: asyncio.subprocess.Process) -> None:
    """Read the killed helper's streams to their end and drop it, for at most
    `_DRAIN_SECONDS` (a process outside its group may hold a pipe); then the pipes are
    closed under it."""
    readers = [r for r in (proc.stdout, proc.stderr) if r is not None]

    async def drain(reader: asyncio.StreamReader) -> None:
        while await reader.read(_CHUNK):
            pass

    try:
        async with asyncio.timeout(_DRAIN_SECONDS):
            await asyncio.gather(*(drain(r) for r in readers))
    except TimeoutError:
        transport = getattr(proc, "_transport", None)  # asyncio keeps no public handle
        if transport is not None:
            transport.close()


async def _feed(writer: asyncio.StreamWriter | None, data: bytes | None) -> None:
    """Write `data` to the helper's stdin and close it; a helper that exits without
    reading it all is no error (its exit status says what happened)."""
    if writer is None:
        return
    try:
        if data:
            writer.write(data)
            await writer.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        writer.close()


async def kill_and_reap(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL `proc` with its process group (also when the leader is gone but a child
    holds a pipe) and wait for it; the members it leaves behind go to the sweep."""
    kill_group(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()  # in case it is not its group's leader
    await asyncio.shield(proc.wait())
