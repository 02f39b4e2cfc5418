"""ExecSync: run a command in a running container and collect its output.

It runs through `conmon --exec --sync` (conmon then runs `<runtime> exec --detach`).
A foreground `runc exec` cannot be used: runc copies the process's stdio through its
own pipes and only returns once they reach EOF, so a background child left holding
stdout (`sh -c 'sleep 100 & echo hi'`) keeps it, and the call, alive. conmon instead
is the subreaper of the exec'd process, stops its I/O loop as soon as that process
exits, and reports the exit code on the sync pipe. Its `passthrough` log driver hands
the process our own stdout and stderr pipes: we keep the first bytes of each (capped
so the response fits the kubelet's message limit) and drop the rest as it comes, so no
output reaches the disk. A cancelled call kills what it started: it has nothing to
finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pycri import procs
from pycri.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, NotFound
from pycri.monitor.conmon import DEFAULT_CONMON
from pycri.oci.runtime import OCIRuntime, OCIRuntimeError, check_id, runtime_failure

MAX_RESPONSE = 16 * 1024 * 1024  # what the kubelet accepts in one CRI message
# ExecSyncResponse around the output: two length-delimited fields (a tag byte and a
# length of at most 4 bytes, under 256 MiB) and exit_code (a tag, up to 10 bytes when
# negative).
_FRAMING = 2 * (1 + 4) + (1 + 10)
MAX_OUTPUT = MAX_RESPONSE - _FRAMING  # stdout and stderr together
_CHUNK = 1 << 16
_DRAIN_MAX = 1 << 20  # past the largest pipe buffer a process can fill unread
_REAP_TIMEOUT = 5.0
_ERROR_TAIL = 4096  # of stderr, for the message of a runtime that failed to exec


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


class ExecTimeout(DeadlineExceeded):
    """The command ran past its timeout and was killed; carries what it wrote."""

    def __init__(self, message: str, stdout: bytes, stderr: bytes) -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr


def exec_process(base: dict[str, Any], argv: list[str], env: list[str] | None) -> dict[str, Any]:
    """The container's process spec (user, cwd, env, caps...) running `argv` instead."""
    proc = copy.deepcopy(base)
    proc["args"] = list(argv)
    proc["terminal"] = False
    proc.pop("consoleSize", None)
    if env:
        proc["env"] = [*proc.get("env", []), *env]
    return proc


def _kill_tree(pid_file: Path) -> bool:
    """SIGKILL the exec'd process (its whole group when it leads one)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return False
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    return True


def sweep_orphans(work_root: Path) -> int:
    """Kill what the exec sessions of a daemon that died (kill -9) left running and
    remove their work dirs (the process spec carries the container's env). Called
    before serving, so no live session is touched; returns how many were found."""
    found = 0
    if work_root.is_dir():
        for d in work_root.iterdir():
            found += 1
            _kill_tree(d / "pid")  # conmon --exec exits once its process is gone
            shutil.rmtree(d, ignore_errors=True)
    work_root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return found


async def exec_sync(
    cid: str,
    argv: list[str],
    *,
    runtime: OCIRuntime,
    timeout: float | None,
    process: dict[str, Any] | None = None,
    env: list[str] | None = None,
    max_output: int = MAX_OUTPUT,
    conmon: str = DEFAULT_CONMON,
    work_root: Path | None = None,
) -> ExecResult:
    """Run `argv` in container `cid`; `process` defaults to the bundle's config.json one.
    `max_output` bounds stdout and stderr together (shared as `fit_output` says).
    The session's files live in a fresh dir under `work_root` (the system temp dir by
    default), which sweep_orphans() clears after a crash.

    Raises NotFound (unknown container), FailedPrecondition (not running),
    ExecTimeout (killed at `timeout`; a `timeout` of None or <= 0 means none).
    """
    check_id(cid)
    if not argv:
        raise InvalidArgument("exec needs a command")
    state = await runtime.state(cid)
    if state is None:
        raise NotFound(f"container {cid} is not known to {runtime.name}")
    if state.get("status") != "running":
        raise FailedPrecondition(f"container {cid} is {state.get('status')}, not running")
    if process is None:
        with open(Path(state["bundle"]) / "config.json") as f:
            process = json.load(f)["process"]
    assert process is not None
    limit = timeout if timeout and timeout > 0 else None
    with tempfile.TemporaryDirectory(prefix="pycri-exec-", dir=work_root) as tmp:
        work = Path(tmp)
        (work / "process.json").write_text(json.dumps(exec_process(process, argv, env)))
        return await _run(conmon, runtime, cid, work, limit, max_output)


def _conmon_argv(conmon: str, runtime: OCIRuntime, cid: str, work: Path) -> list[str]:
    argv = [
        conmon,
        "--api-version", "1",
        "--exec", "--sync",
        "--cid", cid,
        "--cuuid", uuid.uuid4().hex,
        "--runtime", runtime.path,
        "--exec-process-spec", str(work / "process.json"),
        "--container-pidfile", str(work / "pid"),
        "--log-path", "passthrough",
        "--log-level", "error",
    ]  # fmt: skip
    for arg in runtime.global_args:
        argv += ["--runtime-arg", arg]
    return argv


async def _run(
    conmon: str, runtime: OCIRuntime, cid: str, work: Path, limit: float | None, cap: int
) -> ExecResult:
    sync_r, sync_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    try:
        async with procs.slot():  # only while it starts: it lives as long as the command
            proc = await asyncio.create_subprocess_exec(
                *_conmon_argv(conmon, runtime, cid, work),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                pass_fds=(sync_w,),
                env=dict(os.environ, _OCI_SYNCPIPE=str(sync_w)),
                cwd=work,
            )
    except BaseException:
        for fd in (sync_r, out_r, err_r):
            os.close(fd)
        raise
    finally:
        for fd in (sync_w, out_w, err_w):
            os.close(fd)
    reports = _SyncReader(sync_r)
    output = OutputBudget(cap)
    stdout = _Capture(out_r, functools.partial(output.add, 0))
    stderr = _Capture(err_r, functools.partial(output.add, 1))
    timed_out = False
    try:
        try:
            await asyncio.wait_for(asyncio.shield(reports.eof), limit)
        except TimeoutError:
            timed_out = True
        await _finish(proc, work / "pid", kill=timed_out)
    except asyncio.CancelledError:
        await _uncancellable(_finish(proc, work / "pid", kill=True))
        raise
    finally:
        reports.close()
        stdout.drain()
        stderr.drain()
        out, err = output.result()
    if timed_out:
        raise ExecTimeout(f"command timed out after {limit:g}s and was killed", out, err)
    return ExecResult(_exit_code(reports.messages, runtime, cid, err), out, err)


async def _finish(proc: asyncio.subprocess.Process, pid_file: Path, *, kill: bool) -> None:
    """Wait for conmon to exit, killing the exec'd process first when asked to. Its pid
    file appears only once the runtime has started it, so keep killing until conmon
    (which exits as soon as its child has) is gone; conmon itself is killed last, so no
    process it started is left unwatched."""
    deadline = asyncio.get_running_loop().time() + _REAP_TIMEOUT
    while proc.returncode is None and asyncio.get_running_loop().time() < deadline:
        if kill:
            _kill_tree(pid_file)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), 0.05 if kill else _REAP_TIMEOUT)
    if proc.returncode is None:
        # A runtime hung in `exec` is in conmon's session: take the whole group.
        await procs.kill_and_reap(proc)


async def _uncancellable(coro: Coroutine[Any, Any, None]) -> None:
    """Run cleanup to its end even if the caller is cancelled again while it runs."""
    task = asyncio.ensure_future(coro)
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)
    task.result()


class OutputBudget:
    """stdout and stderr as they arrive, each cut to the most `fit_output` could still
    return of it: together they hold about `budget` bytes, never twice that."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.streams = (bytearray(), bytearray())

    def add(self, index: int, chunk: bytes) -> None:
        mine, other = self.streams[index], self.streams[1 - index]
        if (room := self._limit(1 - index) - len(mine)) > 0:
            mine += chunk[:room]
        del other[self._limit(index) :]  # the other's room shrinks as this one grows

    def _limit(self, other: int) -> int:
        """The most fit_output can return of one stream, given what the `other` holds;
        that only grows, so nothing cut now could be returned later."""
        share = _shares(self.budget)[other]
        return self.budget - min(len(self.streams[other]), share)

    def result(self) -> tuple[bytes, bytes]:
        return fit_output(bytes(self.streams[0]), bytes(self.streams[1]), self.budget)


def _shares(budget: int) -> tuple[int, int]:
    return budget // 2, budget - budget // 2


def fit_output(stdout: bytes, stderr: bytes, budget: int) -> tuple[bytes, bytes]:
    """The first bytes of each stream, `budget` bytes together at most: each stream is
    sure of its half, and what one of them does not use goes to the other."""
    if len(stdout) + len(stderr) <= budget:
        return stdout, stderr
    out_share, err_share = _shares(budget)
    if len(stdout) <= out_share:
        return stdout, stderr[: budget - len(stdout)]
    if len(stderr) <= err_share:
        return stdout[: budget - len(stderr)], stderr
    return stdout[:out_share], stderr[:err_share]


def _exit_code(
    messages: list[dict[str, Any]], runtime: OCIRuntime, cid: str, stderr: bytes
) -> int:
    """api v1 exec: first report is the pid (<= 0: runtime failed), the last the exit code.
    A runtime that fails to start the process reports nothing: with the passthrough log
    driver its error went to our stderr pipe instead."""
    if not messages:
        if stderr.strip():
            raise runtime_failure(runtime.name, "exec", cid, stderr[-_ERROR_TAIL:])
        raise OCIRuntimeError(runtime.name, "exec", cid, "conmon exited without a report")
    first = messages[0]
    if int(first.get("data", -1)) <= 0 or len(messages) < 2:
        raise runtime_failure(runtime.name, "exec", cid, str(first.get("message", "failed")))
    return int(messages[-1]["data"])


class _SyncReader:
    """Collect conmon's JSON reports from the sync pipe until it closes."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.eof: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        os.set_blocking(fd, False)
        asyncio.get_running_loop().add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        if chunk:
            self.buf += chunk
        else:
            asyncio.get_running_loop().remove_reader(self.fd)
            if not self.eof.done():
                self.eof.set_result(None)

    @property
    def messages(self) -> list[dict[str, Any]]:
        out = []
        for line in bytes(self.buf).splitlines():
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict):
                    out.append(obj)
        return out

    def close(self) -> None:
        if not self.eof.done():
            asyncio.get_running_loop().remove_reader(self.fd)
            self.eof.cancel()
        os.close(self.fd)


class _Capture:
    """Read a pipe to its end, handing each chunk to `sink` (which keeps what fits), so
    the command never blocks on a full pipe and its output never touches the disk."""

    def __init__(self, fd: int, sink: Callable[[bytes], None]) -> None:
        self.fd = fd
        self.sink = sink
        self.open = True
        os.set_blocking(fd, False)
        asyncio.get_running_loop().add_reader(fd, self._read)

    def _read(self) -> int:
        """Read once; the bytes read, 0 at EOF or when nothing is there yet."""
        try:
            chunk = os.read(self.fd, _CHUNK)
        except BlockingIOError:
            return 0
        if not chunk:
            self._close()
            return 0
        self.sink(chunk)
        return len(chunk)

    def drain(self) -> None:
        """What the pipe still holds, then close it. The exec'd process has exited, so
        all it wrote is buffered; a background child may keep the pipe open (and
        writing) forever, so stop at "nothing more now", after a pipe's worth at most."""
        taken = 0
        while self.open and taken < _DRAIN_MAX and (n := self._read()):
            taken += n
        self._close()

    def _close(self) -> None:
        if self.open:
            asyncio.get_running_loop().remove_reader(self.fd)
            os.close(self.fd)
            self.open = False
