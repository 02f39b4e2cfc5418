"""Run OCI bundles under conmon: the part pod infra processes and containers share.

One place knows where bundles, monitor files and exit files live, which runtime
a handler names, and how to learn that a process exited (conmon's exit files,
watched with inotify — never by polling the runtime).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
from collections.abc import AsyncIterator, Callable, Collection
from pathlib import Path
from typing import Any

from pycri import metrics
from pycri.config import Config
from pycri.errors import FailedPrecondition, InvalidArgument
from pycri.monitor import conmon
from pycri.monitor.exits import ExitWatcher, parse_exit_code
from pycri.monitor.probe import Fact, Probe, is_alive, is_same
from pycri.monitor.reaper import Reaper
from pycri.oci.runtime import OCIRuntime, OCIRuntimeError, criu_errors
from pycri.store import beside
from pycri.store.identity import Identity

log = logging.getLogger(__name__)

ExitHandler = Callable[[str, int, int], None]
FROZEN_MARK = "frozen"  # in a bundle: pycri froze its processes and has not thawed them


class Launcher:
    """Creates, starts, signals and deletes OCI bundles; reports their exits."""

    def __init__(self, cfg: Config, reaper: Reaper) -> None:
        self.cfg = cfg
        self.reaper = reaper
        self.runtimes: dict[str, OCIRuntime] = {}
        self._retired: dict[str, OCIRuntime] = {}  # handlers a reload dropped
        self.set_runtimes()
        state = Path(cfg.state)
        self.exit_dir = state / "exits"
        self.bundles = state / "bundles"
        self._handlers: list[ExitHandler] = []
        self._exited: dict[str, asyncio.Event] = {}
        self._watcher = ExitWatcher(self.exit_dir, self._on_exit)
        self._monitors: dict[str, asyncio.Task[None]] = {}  # oid -> watch on its conmon

    # -- setup -------------------------------------------------------------------

    def set_runtimes(self) -> None:
        """(Re)build the handlers from `cfg.runtimes` (at start and on reload). A dropped
        handler stays known to `runtime()`: the pods it runs must still stop and go."""
        for name, rt in self.runtimes.items():
            if name not in self.cfg.runtimes:
                self._retired[name] = rt
        self.runtimes = {
            name: OCIRuntime(name, h.path, self.cfg.runtime_root(name), h.timeout)
            for name, h in self.cfg.runtimes.items()
        }
        for name in self.runtimes:
            self._retired.pop(name, None)

    async def watch(self, live: Collection[str]) -> None:
        """Watch the exit dir, and report the exits of `live` objects (their records say
        they run) that happened while pycri was down: one directory listing and a read
        per missed exit, so it is cheap however many bundles there are. Monitors that
        died meanwhile are found by the recheck (`probe`, then `watch_monitor`)."""
        self.bundles.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._watcher.start()
        for oid in await asyncio.to_thread(self._watcher.present, live):
            self._watcher.report(oid)

    def close(self) -> None:
        self._watcher.close()
        for task in self._monitors.values():
            task.cancel()
        self._monitors.clear()

    def on_exit(self, handler: ExitHandler) -> None:
        self._handlers.append(handler)

    def _on_exit(self, oid: str, code: int, finished_at: int) -> None:
        for handler in self._handlers:
            try:
                handler(oid, code, finished_at)
            except Exception:
                log.exception("exit handler failed for %s", oid)
        self._event(oid).set()

    def _event(self, oid: str) -> asyncio.Event:
        return self._exited.setdefault(oid, asyncio.Event())

    # -- names ---------------------------------------------------------------------

    def _name(self, handler: str) -> str:
        name = handler or self.cfg.default_runtime
        if name not in self.runtimes:
            known = ", ".join(sorted(self.runtimes))
            raise InvalidArgument(f"unknown runtime handler {handler!r} (configured: {known})")
        return name

    def handler_name(self, handler: str) -> str:
        """The handler a new pod gets ("" is the default); it must be installed."""
        name = self._name(handler)
        path = self.runtimes[name].path
        if not os.access(path, os.X_OK):
            raise FailedPrecondition(f"runtime handler {name!r}: {path} is not installed")
        return name

    def runtime(self, handler: str) -> OCIRuntime:
        """The runtime of an existing object (no install check: it must stay removable)."""
        if handler in self._retired:
            return self._retired[handler]
        return self.runtimes[self._name(handler)]

    def bundle_dir(self, oid: str) -> Path:
        return self.bundles / oid

    def spec_path(self, oid: str) -> Path:
        return self.bundle_dir(oid) / "config.json"

    def persist_dir(self, oid: str) -> Path:
        return self.bundles / oid / "monitor"

    def exit_file(self, oid: str) -> Path:
        return self.exit_dir / oid

    # -- lifecycle -------------------------------------------------------------------

    def write_bundle(self, oid: str, spec: dict[str, Any], record: bytes) -> Path:
        """The bundle directory with the spec, for a process created now or restored
        later, and the object's `record` (store/beside.py: what a damaged database is
        rebuilt from), made with its final mode (it holds the request's env values)."""
        bundle = self.bundle_dir(oid)
        bundle.mkdir(parents=True, exist_ok=False, mode=0o700)
        try:
            (bundle / "config.json").write_text(json.dumps(spec))
            fd = os.open(bundle / beside.NAME,
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            with open(fd, "wb") as f:
                f.write(record)
        except BaseException:
            shutil.rmtree(bundle, ignore_errors=True)
            raise
        return bundle

    async def create(
        self,
        oid: str,
        spec: dict[str, Any],
        handler: str,
        log_path: Path,
        *,
        record: bytes,
        tty: bool = False,
        stdin: bool = False,
        stdin_once: bool = False,
    ) -> conmon.Created:
        """Write the bundle and have conmon create the process; undone on failure."""
        bundle = self.write_bundle(oid, spec, record)
        try:
            return await self._run_monitor(oid, handler, log_path, "create", tty=tty,
                                           stdin=stdin, stdin_once=stdin_once)
        except BaseException:
            shutil.rmtree(bundle, ignore_errors=True)
            raise

    async def restore(
        self,
        oid: str,
        handler: str,
        log_path: Path,
        images: Path,
        criu: str,
        **stdio: bool,
    ) -> conmon.Created:
        """Have conmon restore the process of the bundle written before (`write_bundle`)
        from CRIU's `images`: it runs when this returns, watched like a created one.
        `stdio`: tty, stdin, stdin_once as for `create`. It may take `checkpoint.timeout`
        s. A failure leaves the bundle for the container's removal, and names CRIU's
        reason."""
        runtime = self.runtime(handler)
        try:
            return await self._run_monitor(oid, handler, log_path, "restore", restore=images,
                                           runtime_options=tuple(runtime.criu_options(criu)),
                                           timeout=self.cfg.checkpoint.timeout, **stdio)
        except OCIRuntimeError as e:
            why = criu_errors(self.bundle_dir(oid) / "restore.log")
            raise OCIRuntimeError(runtime.name, "restore", oid, f"{e.detail}{why}") from None

    async def _run_monitor(
        self, oid: str, handler: str, log_path: Path, action: str, **options: Any
    ) -> conmon.Created:
        self._exited.pop(oid, None)
        runtime = self.runtime(handler)
        with metrics.timed(metrics.RUNTIME_SECONDS.labels(runtime.name, action),
                           metrics.RUNTIME_ERRORS.labels(runtime.name, action)):  # fmt: skip
            created = await conmon.create(
                oid,
                self.bundle_dir(oid),
                runtime=runtime,
                log_path=log_path,
                exit_dir=self.exit_dir,
                persist_dir=self.persist_dir(oid),
                conmon=self.cfg.conmon,
                reaper=self.reaper,
                **options,
            )
        init = Identity(created.pid, created.start_time) if created.start_time else None
        self.watch_monitor(oid, created.conmon_pid, conmon.is_monitor_of(created.conmon_pid, oid),
                           init)
        return created

    # -- monitors --------------------------------------------------------------------

    def watch_monitor(self, oid: str, conmon_pid: int, alive: bool,
                      init: Identity | None) -> None:
        """Notice when `oid`'s conmon dies without writing the exit file (SIGKILL, OOM
        killer, a bug): its process would run on unwatched and be reported RUNNING for
        ever. Then the process is killed and its exit recorded as the monitor's loss.
        `alive`: whether `conmon_pid` is still `oid`'s conmon (not, when it died while
        pycri was down, or its pid was reused since); `init`: the process, if known."""
        if oid not in self._monitors:
            self._monitors[oid] = asyncio.create_task(
                self._monitor(oid, conmon_pid, alive, init))

    async def _monitor(self, oid: str, conmon_pid: int, alive: bool,
                       init: Identity | None) -> None:
        if alive:  # one pidfd notices its end and reaps it
            await self.reaper.wait(conmon_pid)
        if self.exit_code(oid) is not None:  # conmon reported the exit, as it should
            return
        try:
            await self._record_lost(oid, conmon_pid, init)
        except OSError as e:  # removed meanwhile (bundle gone): nothing left to report
            log.warning("process %s: cannot record its monitor's death: %s", oid, e)

    async def _record_lost(self, oid: str, conmon_pid: int, init: Identity | None) -> None:
        msg = f"the monitor (conmon, pid {conmon_pid}) died without reporting the exit"
        if init is not None and not is_alive(init):
            # Its process is gone too (its pid may name another process by now): nothing
            # to kill; what it left in its cgroup goes when the exit is recorded.
            log.error("process %s: %s; the process had exited too", oid, msg)
            msg += "; the process had exited too"
            if is_same(init):  # a zombie, perhaps re-parented to us
                await self.reaper.wait(init.pid, 10.0)
        else:
            log.error("process %s: %s; killing it", oid, msg)
            try:
                await self._kill_unmonitored(oid, init)
            except Exception as e:  # still recorded: nothing would ever report this exit
                log.error("process %s: cannot kill it after its monitor died: %s", oid, e)
                msg += f"; killing the process failed: {e}"
            else:
                msg += "; the process was killed"
        conmon.lost_file(self.persist_dir(oid)).write_text(msg)
        tmp = self.exit_dir / f".{oid}.lost"
        tmp.write_text(str(128 + signal.SIGKILL))
        os.replace(tmp, self.exit_file(oid))
        self._watcher.report(oid)

    async def _kill_unmonitored(self, oid: str, init: Identity | None) -> None:
        """SIGKILL everything of `oid` through whichever runtime knows it, and reap its
        process: with conmon gone it was re-parented to us (a subreaper)."""
        for runtime in [*self.runtimes.values(), *self._retired.values()]:
            if (runtime.root / oid).exists():
                await runtime.kill(oid, signal.SIGKILL, all_processes=True)
        pid = init.pid if init else conmon.read_pid(conmon.pid_file(self.persist_dir(oid)))
        if pid and (init is None or is_same(init)):  # never wait on a reused pid
            await self.reaper.wait(pid, 10.0)

    def monitors_running(self) -> int:
        """How many conmons are being watched now (the metrics' conmon count)."""
        return sum(1 for t in list(self._monitors.values()) if not t.done())

    def monitor_lost(self, oid: str) -> str:
        """Why `oid`'s exit was recorded by pycri instead of conmon ("" if it was not)."""
        try:
            return conmon.lost_file(self.persist_dir(oid)).read_text()
        except OSError:
            return ""

    async def start(self, oid: str, handler: str) -> None:
        await self.runtime(handler).start(oid)

    async def kill(self, oid: str, handler: str, sig: int) -> None:
        """Signal the process; one already gone is fine."""
        await self.runtime(handler).kill(oid, sig)

    async def wait_exit(self, oid: str, timeout: float | None) -> bool:
        """True once conmon reported the exit and the handlers have recorded it; False at
        the timeout, or as soon as the monitor is gone without reporting (after a crash
        of pycri during create, conmon can die of SIGPIPE on the sync pipe)."""
        if self._watcher.report(oid):  # already there: record it now, not on inotify's turn
            return True
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._event(oid).wait())]
        monitor = self._monitors.get(oid)
        pid = self._monitor_pid(oid)
        if monitor is not None:  # ends once the exit is recorded, by conmon or by us
            waits.append(asyncio.ensure_future(asyncio.shield(monitor)))
        elif pid:
            waits.append(asyncio.ensure_future(self.reaper.wait(pid, timeout)))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return self._event(oid).is_set() or self._watcher.report(oid)

    def _monitor_pid(self, oid: str) -> int:
        return conmon.read_pid(conmon.conmon_pid_file(self.persist_dir(oid)))

    def probe(self, oid: str, init: Identity | None) -> Probe:
        """What the disk says about `oid`'s process now (file reads: call from a thread).
        The exit file is read first, so an exit between the reads is seen as GONE, and
        then conmon's exit file (or the monitor's loss) follows."""
        path = self.exit_file(oid)
        try:
            mtime = path.stat().st_mtime_ns
            return Probe(Fact.EXITED, parse_exit_code(path.read_text()), mtime)
        except (FileNotFoundError, ValueError):  # none, or being written: inotify follows
            pass
        if not self.bundle_dir(oid).is_dir():
            return Probe(Fact.LOST)
        conmon_pid = self._monitor_pid(oid)
        alive = conmon.is_monitor_of(conmon_pid, oid)
        fact = Fact.UNKNOWN if init is None else Fact.RUNS if is_alive(init) else Fact.GONE
        return Probe(fact, conmon_pid=conmon_pid, conmon_alive=alive,
                     left_frozen=(self.bundle_dir(oid) / FROZEN_MARK).exists())

    @contextlib.asynccontextmanager
    async def frozen(self, oid: str, handler: str) -> AsyncIterator[None]:
        """`oid`'s processes frozen (the runtime's pause) for the body, thawed after it
        whatever happens. A mark in the bundle says they are frozen until they are
        thawed, so that a pycri killed in between thaws them at its next start
        (`thaw`, from the recheck): nothing else ever would, and a frozen container
        never even dies of SIGKILL."""
        runtime = self.runtime(handler)
        mark = self.bundle_dir(oid) / FROZEN_MARK
        await asyncio.to_thread(mark.touch)
        try:
            await runtime.pause(oid)
        except BaseException:
            mark.unlink(missing_ok=True)
            raise
        try:
            yield
        finally:
            await asyncio.shield(self.thaw(oid, handler))

    async def thaw(self, oid: str, handler: str) -> None:
        """Thaw what `frozen` froze, and drop its mark."""
        await self.runtime(handler).pause(oid, resume=True)
        (self.bundle_dir(oid) / FROZEN_MARK).unlink(missing_ok=True)

    def exit_code(self, oid: str) -> int | None:
        try:
            return parse_exit_code(self.exit_file(oid).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def oom_killed(self, oid: str) -> bool:
        return conmon.oom_killed(self.persist_dir(oid))

    def spec(self, oid: str) -> dict[str, Any] | None:
        """The OCI spec the process was created with (for verbose status), if still there."""
        try:
            doc: dict[str, Any] = json.loads((self.bundle_dir(oid) / "config.json").read_text())
        except (OSError, ValueError):
            return None
        return doc

    async def state(self, oid: str, handler: str) -> dict[str, Any] | None:
        return await self.runtime(handler).state(oid)

    async def delete(self, oid: str, handler: str) -> None:
        """Forget the process: runtime state, bundle, monitor and exit files."""
        monitor = self._monitors.pop(oid, None)
        if monitor is not None:
            monitor.cancel()
        with contextlib.suppress(InvalidArgument):  # handler removed from config since
            await self.runtime(handler).delete(oid, force=True)
        shutil.rmtree(self.bundle_dir(oid), ignore_errors=True)
        self.exit_file(oid).unlink(missing_ok=True)
        self._exited.pop(oid, None)

    async def reopen_log(self, oid: str, log_path: Path) -> None:
        await conmon.reopen_log(self.bundle_dir(oid), log_path)

