"""Start containers under conmon (2.1.x) and talk to a running conmon.

conmon is started with `--api-version 1`; it double-forks (so it outlives pycri),
waits on the start pipe until we have placed it in its cgroup, runs
`runtime create`, and reports on the sync pipe one JSON line: `{"data": <pid>}`
on success or `{"data": -1, "message": "<runtime stderr>"}` on failure.

Where conmon puts things (fixed by conmon itself):
- `<bundle>/ctl` and `<bundle>/winsz` fifos, `<bundle>/attach` socket (--full-attach);
- `<persist_dir>/pidfile` (container pid), `<persist_dir>/conmon.pid`,
  `<persist_dir>/exit` and `<exit_dir>/<cid>` (exit code), `<persist_dir>/oom`
  (created when the kernel OOM-killed something in the container's memory cgroup).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from pycri import procs
from pycri.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, PycriError
from pycri.monitor.probe import identity_of
from pycri.monitor.reaper import Reaper
from pycri.oci.runtime import OCIRuntime, OCIRuntimeError, check_id, runtime_failure

DEFAULT_CONMON = "/usr/bin/conmon"
_FIFOS = ("ctl", "winsz", "attach")


@dataclass(frozen=True)
class Created:
    """A created (not yet started) container and the conmon that watches it."""

    pid: int
    conmon_pid: int
    # The process's start time (/proc/<pid>/stat field 22), read while it certainly is
    # ours: with the pid it names the process after a restart, even once the pid is
    # reused. 0 if it could not be read (it exited at once).
    start_time: int = 0


def ctl_path(bundle: Path) -> Path:
    return Path(bundle) / "ctl"


def attach_path(bundle: Path) -> Path:
    """SOCK_SEQPACKET socket; each packet starts with a stream byte."""
    return Path(bundle) / "attach"


def pid_file(persist_dir: Path) -> Path:
    return Path(persist_dir) / "pidfile"


def read_pid(path: Path) -> int:
    """The pid in a pid file, 0 if there is none (yet)."""
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return 0


def conmon_pid_file(persist_dir: Path) -> Path:
    return Path(persist_dir) / "conmon.pid"


def oom_file(persist_dir: Path) -> Path:
    """conmon creates this (empty) when the container's memory cgroup saw an OOM kill."""
    return Path(persist_dir) / "oom"


def lost_file(persist_dir: Path) -> Path:
    """Written by pycri (not conmon) when conmon died without reporting the exit; it
    holds the message the exit is reported with."""
    return Path(persist_dir) / "monitor-lost"


def is_monitor_of(pid: int, cid: str) -> bool:
    """Whether `pid` is (still) the conmon of `cid`, not a process that reused its pid."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(argv) and os.path.basename(argv[0]) == b"conmon" and cid.encode() in argv


def oom_killed(persist_dir: Path) -> bool:
    """Whether the exit should be reported with reason OOMKilled."""
    return oom_file(persist_dir).exists()


def _build_argv(
    conmon: str,
    cid: str,
    bundle: Path,
    runtime: OCIRuntime,
    log_path: Path,
    exit_dir: Path,
    persist_dir: Path,
    tty: bool,
    stdin: bool,
    stdin_once: bool,
    log_size_max: int | None,
    restore: Path | None = None,
    runtime_options: tuple[str, ...] = (),
) -> list[str]:
    argv = [
        conmon,
        "--api-version", "1",
        "--cid", cid,
        "--cuuid", cid,
        "--name", cid,
        "--runtime", runtime.path,
        "--bundle", str(bundle),
        "--container-pidfile", str(pid_file(persist_dir)),
        "--conmon-pidfile", str(conmon_pid_file(persist_dir)),
        "--log-path", f"k8s-file:{log_path}",
        "--exit-dir", str(exit_dir),
        "--persist-dir", str(persist_dir),
        "--socket-dir-path", str(persist_dir),
        "--full-attach",
        "--log-level", "error",
    ]  # fmt: skip
    for arg in [*runtime.global_args, *runtime_options]:
        argv += ["--runtime-arg", arg]
    if restore is not None:  # `runtime restore --detach` of the bundle, from these images
        argv += ["--restore", str(restore)]
    if tty:
        argv.append("--terminal")
    if stdin:
        argv.append("--stdin")
        if not stdin_once:
            argv.append("--leave-stdin-open")
    if log_size_max is not None and log_size_max > 0:
        argv += ["--log-size-max", str(log_size_max)]
    return argv


async def create(
    cid: str,
    bundle: Path,
    *,
    runtime: OCIRuntime,
    log_path: Path,
    exit_dir: Path,
    persist_dir: Path,
    tty: bool = False,
    stdin: bool = False,
    stdin_once: bool = False,
    conmon_cgroups: list[Path] | None = None,
    log_size_max: int | None = None,
    conmon: str = DEFAULT_CONMON,
    timeout: float | None = None,
    reaper: Reaper | None = None,
    restore: Path | None = None,
    runtime_options: tuple[str, ...] = (),
) -> Created:
    """Have conmon run `runtime create`; returns once the container exists (not started).
    With `restore` (a CRIU image directory) conmon runs `runtime restore` instead, and
    the container runs when this returns; `runtime_options` go before the command.

    `conmon_cgroups`: existing cgroup directories (one per hierarchy) conmon is moved
    into before it forks, so it and the runtime are accounted there.
    `reaper`: watches the daemonized conmon, so its exit leaves no zombie.
    `timeout`: how long `runtime create` may take (default: the runtime's own limit).
    On any failure everything this call made is removed again, and conmon is gone with
    the runtime it ran (a hung runtime is killed with it).
    """
    limit = runtime.timeout if timeout is None else timeout
    check_id(cid)
    bundle = Path(bundle)
    if not (bundle / "config.json").is_file():
        raise InvalidArgument(f"bundle {bundle} has no config.json")
    if not Path(exit_dir).is_dir():
        raise InvalidArgument(f"exit dir {exit_dir} does not exist")
    if not Path(log_path).parent.is_dir():
        raise InvalidArgument(f"log directory {Path(log_path).parent} does not exist")
    persist_dir = Path(persist_dir)
    made_persist = not persist_dir.exists()
    persist_dir.mkdir(parents=True, exist_ok=True)
    made_log = not Path(log_path).exists()
    argv = _build_argv(
        conmon, cid, bundle, runtime, Path(log_path), Path(exit_dir), persist_dir,
        tty, stdin, stdin_once, log_size_max, restore, runtime_options,
    )  # fmt: skip
    sync_r, sync_w = os.pipe2(os.O_CLOEXEC)
    start_r, start_w = os.pipe2(os.O_CLOEXEC)
    env = dict(os.environ, _OCI_SYNCPIPE=str(sync_w), _OCI_STARTPIPE=str(start_r))
    conmon_pid = 0
    exited: asyncio.Future[int | None] | None = None  # the reaper's watch on conmon
    proc: asyncio.subprocess.Process | None = None
    # Until its pid file is read, the daemonized conmon (re-parented to us) must not
    # be swept as an orphan: its pid would be free for reuse before we watch it.
    hold = contextlib.ExitStack()
    if reaper is not None:
        hold.enter_context(reaper.expecting())
    try:
        async with procs.slot():  # conmon and the `runtime create` it runs
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE,
                    pass_fds=(sync_w, start_r),
                    env=env,
                    cwd=persist_dir,  # conmon also drops a relative "oom" file in its cwd
                )
            finally:
                os.close(sync_w)
                os.close(start_r)
            try:
                for cg in conmon_cgroups or []:
                    (Path(cg) / "cgroup.procs").write_text(str(proc.pid))
            except OSError as e:
                proc.kill()
                await proc.wait()
                raise FailedPrecondition(f"cannot move conmon into cgroup: {e}") from None
            os.write(start_w, b"0")
            os.close(start_w)
            start_w = -1
            _, err = await proc.communicate()
            if proc.returncode != 0:
                raise PycriError(f"conmon for {cid} failed to start: {err.decode().strip()}")
            conmon_pid = int(conmon_pid_file(persist_dir).read_text().strip())
            if reaper is not None:
                exited = reaper.watch(conmon_pid)
            hold.close()
            pid = await asyncio.wait_for(_read_sync(sync_r, runtime, cid), limit)
        # `runtime init` waits for its start, a child of conmon: this pid is the process.
        init = identity_of(pid)
        return Created(pid=pid, conmon_pid=conmon_pid, start_time=init.start if init else 0)
    except BaseException as e:
        if proc is not None and not conmon_pid:
            # Cut off (cancelled) before the pid file was read: the daemonized conmon may
            # be on its way to `runtime create`. Its parent writes the file, then exits.
            await asyncio.shield(proc.wait())
            conmon_pid = read_pid(conmon_pid_file(persist_dir))
        await _undo(cid, bundle, runtime, persist_dir, made_persist, Path(log_path), made_log,
                    conmon_pid, exited)  # fmt: skip
        if isinstance(e, TimeoutError):
            msg = (f"{runtime.name} create {cid}: no answer within {limit:g}s, killed "
                   f"(the limit is runtimes.{runtime.name}.timeout)")
            raise DeadlineExceeded(msg) from None
        raise
    finally:
        hold.close()
        os.close(sync_r)
        if start_w >= 0:
            os.close(start_w)


async def _read_sync(fd: int, runtime: OCIRuntime, cid: str) -> int:
    """The first JSON line conmon writes on the sync pipe: the pid, or the runtime error."""
    loop = asyncio.get_running_loop()
    buf = bytearray()
    done: asyncio.Future[None] = loop.create_future()
    os.set_blocking(fd, False)

    def readable() -> None:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        buf.extend(chunk)
        if (not chunk or b"\n" in buf) and not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
    line = bytes(buf).split(b"\n", 1)[0]
    if not line:
        raise OCIRuntimeError(runtime.name, "create", cid, "conmon exited without a report")
    try:
        msg = json.loads(line)
        value = int(msg["data"])
    except (ValueError, KeyError, TypeError):
        raise OCIRuntimeError(runtime.name, "create", cid, f"bad conmon report {line!r}") from None
    if value <= 0:
        raise runtime_failure(runtime.name, "create", cid, str(msg.get("message", "")))
    return value


async def _undo(
    cid: str,
    bundle: Path,
    runtime: OCIRuntime,
    persist_dir: Path,
    made_persist: bool,
    log_path: Path,
    made_log: bool,
    conmon_pid: int,
    exited: asyncio.Future[int | None] | None,
) -> None:
    """Remove what a failed create left: conmon, runtime state, fifos, pid and log files."""
    if conmon_pid > 0:
        await kill_monitor(conmon_pid, exited)
    with contextlib.suppress(PycriError):
        await runtime.delete(cid, force=True)
    # A process the runtime had made (`runc init`) is re-parented to us with conmon
    # killed; the reaper's sweep takes it, so no zombie keeps a shared PID namespace.
    for name in _FIFOS:
        with contextlib.suppress(FileNotFoundError):
            (bundle / name).unlink()
    for f in (pid_file(persist_dir), conmon_pid_file(persist_dir), oom_file(persist_dir)):
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
    if made_persist:
        with contextlib.suppress(OSError):
            persist_dir.rmdir()
    if made_log:
        with contextlib.suppress(FileNotFoundError):
            log_path.unlink()


async def kill_monitor(conmon_pid: int, exited: asyncio.Future[int | None] | None,
                       timeout: float = 10.0) -> None:
    """SIGKILL a conmon with its process group: conmon leads its own session, and the
    runtime it is running (perhaps hung) is in it. `exited` is the reaper's watch on
    conmon since its pid file was read (None: no reaper): the reaper reaps conmon, its
    sweep what the kill re-parents to us. Once the watch has resolved conmon is reaped
    and its pid free for another process: nothing is killed then."""
    if exited is not None and exited.done():
        return
    try:
        leader = os.getpgid(conmon_pid) == conmon_pid
    except ProcessLookupError:
        return
    if leader:
        procs.kill_group(conmon_pid)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(conmon_pid, signal.SIGKILL)
    if exited is None:
        await wait_gone(conmon_pid, timeout)
    else:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(exited), timeout)


async def wait_gone(pid: int, timeout: float) -> bool:
    """Wait (pidfd, no polling) until `pid` has exited; True if it did within `timeout`."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()

    def exited() -> None:
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(pidfd, exited)
    try:
        await asyncio.wait_for(gone, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def _ctl_write(bundle: Path, line: bytes) -> None:
    try:
        fd = os.open(ctl_path(bundle), os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.ENOENT):
            raise FailedPrecondition(f"no conmon is listening on {ctl_path(bundle)}") from None
        raise
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


async def reopen_log(bundle: Path, log_path: Path, timeout: float = 5.0) -> None:
    """Make conmon open a fresh log file at `log_path`; returns once it exists."""
    try:
        before = os.stat(log_path).st_ino
    except FileNotFoundError:
        before = -1
    _ctl_write(bundle, b"2 0 0\n")
    deadline = asyncio.get_running_loop().time() + timeout
    # conmon creates <log>.tmp and renames it over the path: watch for a new inode.
    while True:
        with contextlib.suppress(FileNotFoundError):
            if os.stat(log_path).st_ino != before:
                return
        if asyncio.get_running_loop().time() > deadline:
            raise DeadlineExceeded(f"conmon did not reopen {log_path} within {timeout:g}s")
        await asyncio.sleep(0.01)


def resize(bundle: Path, width: int, height: int) -> None:
    """Resize the container's terminal (conmon's ctl protocol: `1 <height> <width>`)."""
    if width <= 0 or height <= 0:
        raise InvalidArgument(f"terminal size {width}x{height} is not positive")
    _ctl_write(bundle, f"1 {height} {width}\n".encode())
