"""Run a streaming exec in a container: `<runtime> exec --detach`, stdio bridged to channels.

Why detached: in the foreground, runc copies a tty through its *own* stdin/stdout
(it refuses to run without a terminal there) and copies pipes until they close, so a
background child holding stdout holds the session. Detached, the process gets our
pipes directly (or, with a tty, the runtime hands us the pty master over
`--console-socket` with SCM_RIGHTS), the runtime exits once it started, and the
process is re-parented to pycri (a child subreaper, like containerd's shim), so
pycri's Reaper watches it with a pidfd and gets its real exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import socket
import struct
import tempfile
import termios
from pathlib import Path
from typing import Any

from pycri import procs
from pycri.errors import PycriError
from pycri.monitor.execsync import exec_process
from pycri.monitor.reaper import Reaper
from pycri.oci.runtime import OCIRuntime, check_id, runtime_failure
from pycri.streaming import fdio
from pycri.streaming.remotecommand import ByteReader, ByteWriter, StreamIO, TerminalSize

START_TIMEOUT = 60.0
# After the process exits, output still buffered is copied for at most this long
# (a background child may keep the pipe or terminal open forever).
DRAIN_GRACE = 2.0


def set_winsize(fd: int, size: TerminalSize) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.height, size.width, 0, 0))


async def exec_streaming(
    runtime: OCIRuntime, cid: str, base_process: dict[str, Any], argv: list[str], io: StreamIO,
    reaper: Reaper,
) -> int:
    """Run `argv` in `cid` with the container's process settings; returns its exit code."""
    check_id(cid)
    proc = exec_process(base_process, argv, None)
    proc["terminal"] = io.tty
    with tempfile.TemporaryDirectory(prefix="pycri-exec-") as tmp:
        work = Path(tmp)
        (work / "process.json").write_text(json.dumps(proc))
        if io.tty:
            return await _run_tty(runtime, cid, work, io, reaper)
        return await _run_pipes(runtime, cid, work, io, reaper)


def _argv(runtime: OCIRuntime, cid: str, work: Path, tty: bool) -> list[str]:
    argv = [runtime.path, *runtime.global_args, "--log", str(work / "runtime.log"),
            "--log-format", "json", "exec", "--detach", "--pid-file", str(work / "pid"),
            "--process", str(work / "process.json")]  # fmt: skip
    if tty:
        argv += ["--console-socket", str(work / "console.sock")]
    return [*argv, cid]


async def _start(
    runtime: OCIRuntime, cid: str, work: Path, tty: bool, stdio: tuple[int, int, int],
    reaper: Reaper,
) -> int:
    """Run the runtime until the process started; returns its pid, watched by `reaper`."""
    # The process is re-parented to us before its pid file is read: not to be swept.
    with reaper.expecting():
        async with procs.slot():
            child = await asyncio.create_subprocess_exec(
                *_argv(runtime, cid, work, tty), stdin=stdio[0], stdout=stdio[1],
                stderr=stdio[2],
            )  # fmt: skip
            try:
                rc = await asyncio.wait_for(child.wait(), START_TIMEOUT)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                await child.wait()
                raise
        if rc != 0:
            # What the failed exec forked (crun's would-be process in the container's
            # pid namespace) is swept as an orphan once the hold ends.
            try:
                detail = (work / "runtime.log").read_text()
            except OSError:
                detail = f"exited with status {rc}"
            raise runtime_failure(runtime.name, "exec", cid, detail)
        pid = int((work / "pid").read_text().strip())
        reaper.watch(pid)
        return pid


async def _wait(reaper: Reaper, pid: int) -> int:
    """The exit code (128+signal when killed) of the exec'd process `pid`."""
    status = await reaper.status(pid)
    if status is None:
        raise PycriError("the exec'd process was not re-parented to pycri; "
                         "its exit status is unknown")  # fmt: skip
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


async def _copy_out(fd: int, sink: ByteWriter) -> None:
    while data := await fdio.read(fd):
        await sink.write(data)


async def _copy_in(source: ByteReader, fd: int) -> None:
    """Client input to the process; closes the fd at the client's end of input."""
    try:
        while data := await source.read():
            await fdio.write_all(fd, data)
    except (BrokenPipeError, ConnectionError):
        pass
    finally:
        os.close(fd)


async def _finish(reaper: Reaper, pid: int, outputs: list[asyncio.Task[None]],
                  others: list[asyncio.Task[None]]) -> int:  # fmt: skip
    """Wait for the exit, let output drain briefly, then stop every copier."""
    try:
        code = await _wait(reaper, pid)
        if outputs:
            await asyncio.wait(outputs, timeout=DRAIN_GRACE)
        return code
    finally:
        for task in outputs + others:
            task.cancel()
        await asyncio.gather(*outputs, *others, return_exceptions=True)


async def _run_pipes(
    runtime: OCIRuntime, cid: str, work: Path, io: StreamIO, reaper: Reaper
) -> int:
    ours: list[int] = []
    theirs: list[int] = []
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    theirs.append(devnull)
    stdio = [devnull, devnull, devnull]
    for slot, wanted in ((0, io.stdin), (1, io.stdout), (2, io.stderr)):
        if wanted is None:
            continue
        r, w = os.pipe2(os.O_CLOEXEC)
        mine, child = (w, r) if slot == 0 else (r, w)
        os.set_blocking(mine, False)
        ours.append(mine)
        theirs.append(child)
        stdio[slot] = child
    try:
        pid = await _start(runtime, cid, work, False, (stdio[0], stdio[1], stdio[2]), reaper)
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    fds = iter(ours)
    outputs: list[asyncio.Task[None]] = []
    others: list[asyncio.Task[None]] = []
    if io.stdin is not None:
        others.append(asyncio.create_task(_copy_in(io.stdin, next(fds))))
    readers = [next(fds) for sink in (io.stdout, io.stderr) if sink is not None]
    sinks = [sink for sink in (io.stdout, io.stderr) if sink is not None]
    outputs += [asyncio.create_task(_copy_out(fd, s)) for fd, s in zip(readers, sinks, strict=True)]
    try:
        return await _finish(reaper, pid, outputs, others)
    finally:
        for fd in readers:
            os.close(fd)


async def _receive_master(listener: socket.socket) -> int:
    """Accept the runtime's connection on the console socket and take the pty master."""
    loop = asyncio.get_running_loop()
    conn, _ = await loop.sock_accept(listener)
    with conn:
        conn.setblocking(True)
        conn.settimeout(START_TIMEOUT)
        _, fds, _, _ = await asyncio.to_thread(socket.recv_fds, conn, 4096, 1)
    if not fds:
        raise PycriError("the runtime sent no terminal over the console socket")
    return fds[0]


async def _apply_resizes(io: StreamIO, master: int) -> None:
    while True:
        size = await io.resizes.get()
        with contextlib.suppress(OSError):
            set_winsize(master, size)


async def _run_tty(
    runtime: OCIRuntime, cid: str, work: Path, io: StreamIO, reaper: Reaper
) -> int:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    listener.bind(str(work / "console.sock"))
    listener.listen(1)
    listener.setblocking(False)
    receiving = asyncio.create_task(_receive_master(listener))
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        try:
            pid = await _start(runtime, cid, work, True, (devnull, devnull, devnull), reaper)
        finally:
            os.close(devnull)
        # Without its terminal the process still ends (and is reaped) on its own.
        master = await asyncio.wait_for(receiving, START_TIMEOUT)
    except BaseException:
        receiving.cancel()
        with contextlib.suppress(BaseException):
            master_fd = await receiving
            os.close(master_fd)
        raise
    finally:
        listener.close()
    os.set_blocking(master, False)
    outputs: list[asyncio.Task[None]] = []
    others = [asyncio.create_task(_apply_resizes(io, master))]
    if io.stdout is not None:
        outputs.append(asyncio.create_task(_copy_out(master, io.stdout)))
    if io.stdin is not None:
        # A terminal has no end of input: the client's EOF leaves it open.
        writer = os.dup(master)
        others.append(asyncio.create_task(_copy_in(io.stdin, writer)))
    try:
        return await _finish(reaper, pid, outputs, others)
    finally:
        os.close(master)
