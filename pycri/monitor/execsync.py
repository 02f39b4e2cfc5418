"""ExecSync: run a command in a running container and collect its output.

It runs through `conmon --exec --sync` (conmon then runs `<runtime> exec --detach`).
A foreground `runc exec` cannot be used: runc copies the process's stdio through its
own pipes and only returns once they reach EOF, so a background child left holding
stdout (`sh -c 'sleep 100 & echo hi'`) keeps it, and the call, alive. conmon instead
is the subreaper of the exec'd process, stops its I/O loop as soon as that process
exits, drains what is buffered, and reports the exit code on the sync pipe. Output
lands in a CRI-format log file (stdout and stderr tagged apart), read back capped.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import shutil
import signal
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pycri.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, NotFound
from pycri.monitor.conmon import DEFAULT_CONMON
from pycri.oci.runtime import OCIRuntime, OCIRuntimeError, check_id, runtime_failure

MAX_OUTPUT = 16 * 1024 * 1024
# Bounds the temporary log file; output past the cap is dropped anyway.
_LOG_SIZE_MAX = 4 * MAX_OUTPUT
_REAP_TIMEOUT = 5.0


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
        "--log-path", f"k8s-file:{work / 'output.log'}",
        "--log-size-max", str(_LOG_SIZE_MAX),
        "--log-level", "error",
    ]  # fmt: skip
    for arg in runtime.global_args:
        argv += ["--runtime-arg", arg]
    return argv


async def _run(
    conmon: str, runtime: OCIRuntime, cid: str, work: Path, limit: float | None, cap: int
) -> ExecResult:
    sync_r, sync_w = os.pipe2(os.O_CLOEXEC)
    try:
        proc = await asyncio.create_subprocess_exec(
            *_conmon_argv(conmon, runtime, cid, work),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            pass_fds=(sync_w,),
            env=dict(os.environ, _OCI_SYNCPIPE=str(sync_w)),
            cwd=work,
        )
    except BaseException:
        os.close(sync_r)
        raise
    finally:
        os.close(sync_w)
    reports = _SyncReader(sync_r)
    timed_out = False
    try:
        try:
            await asyncio.wait_for(reports.eof, limit)
        except TimeoutError:
            timed_out = True
            _kill_tree(work / "pid")
        try:
            await asyncio.wait_for(proc.wait(), _REAP_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    except asyncio.CancelledError:
        _kill_tree(work / "pid")
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise
    finally:
        reports.close()
    stdout, stderr = read_cri_log(work / "output.log", cap)
    if timed_out:
        raise ExecTimeout(f"command timed out after {limit:g}s and was killed", stdout, stderr)
    return ExecResult(_exit_code(reports.messages, runtime, cid), stdout, stderr)


def _exit_code(messages: list[dict[str, Any]], runtime: OCIRuntime, cid: str) -> int:
    """api v1 exec: first report is the pid (<= 0: runtime failed), the last the exit code."""
    if not messages:
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


def read_cri_log(path: Path, cap: int) -> tuple[bytes, bytes]:
    """Rebuild stdout and stderr from a CRI log (`F` ends a line, `P` does not), capped."""
    streams = {b"stdout": bytearray(), b"stderr": bytearray()}
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
        for line in f:
            parts = line.rstrip(b"\n").split(b" ", 3)
            if len(parts) < 3 or parts[1] not in streams:
                continue
            buf = streams[parts[1]]
            if len(buf) >= cap:
                continue
            buf += parts[3] if len(parts) == 4 else b""
            if parts[2] == b"F":
                buf += b"\n"
            del buf[cap:]
    return bytes(streams[b"stdout"]), bytes(streams[b"stderr"])


