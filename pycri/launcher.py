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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pycri.config import Config
from pycri.errors import FailedPrecondition, InvalidArgument
from pycri.monitor import conmon
from pycri.monitor.exits import ExitWatcher, parse_exit_code
from pycri.monitor.reaper import Reaper
from pycri.oci.runtime import OCIRuntime

log = logging.getLogger(__name__)

ExitHandler = Callable[[str, int, int], None]


class Launcher:
    """Creates, starts, signals and deletes OCI bundles; reports their exits."""

    def __init__(self, cfg: Config, reaper: Reaper) -> None:
        self.cfg = cfg
        self.reaper = reaper
        self.runtimes = {
            name: OCIRuntime(name, h.path, cfg.runtime_root(name))
            for name, h in cfg.runtimes.items()
        }
        state = Path(cfg.state)
        self.exit_dir = state / "exits"
        self.bundles = state / "bundles"
        self._handlers: list[ExitHandler] = []
        self._exited: dict[str, asyncio.Event] = {}
        self._watcher = ExitWatcher(self.exit_dir, self._on_exit)

    # -- setup -------------------------------------------------------------------

    def watch(self) -> None:
        """Watch the exit dir; exits that happened while pycri was down are reported too."""
        self.bundles.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._watcher.start()
        self._watcher.scan()

    def close(self) -> None:
        self._watcher.close()

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
        return self.runtimes[self._name(handler)]

    def bundle_dir(self, oid: str) -> Path:
        return self.bundles / oid

    def persist_dir(self, oid: str) -> Path:
        return self.bundles / oid / "monitor"

    def exit_file(self, oid: str) -> Path:
        return self.exit_dir / oid

    # -- lifecycle -------------------------------------------------------------------

    async def create(
        self,
        oid: str,
        spec: dict[str, Any],
        handler: str,
        log_path: Path,
        *,
        tty: bool = False,
        stdin: bool = False,
        stdin_once: bool = False,
    ) -> conmon.Created:
        """Write the bundle and have conmon create the process; undone on failure."""
        bundle = self.bundle_dir(oid)
        bundle.mkdir(parents=True, exist_ok=False, mode=0o700)
        try:
            (bundle / "config.json").write_text(json.dumps(spec))
            self._exited.pop(oid, None)
            return await conmon.create(
                oid,
                bundle,
                runtime=self.runtime(handler),
                log_path=log_path,
                exit_dir=self.exit_dir,
                persist_dir=self.persist_dir(oid),
                tty=tty,
                stdin=stdin,
                stdin_once=stdin_once,
                conmon=self.cfg.conmon,
                reaper=self.reaper,
            )
        except BaseException:
            shutil.rmtree(bundle, ignore_errors=True)
            raise

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
        pid = self._monitor_pid(oid)
        if pid:
            waits.append(asyncio.ensure_future(conmon.wait_gone(pid, timeout or 1e9)))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return self._event(oid).is_set() or self._watcher.report(oid)

    def _monitor_pid(self, oid: str) -> int:
        try:
            return int(conmon.conmon_pid_file(self.persist_dir(oid)).read_text())
        except (OSError, ValueError):
            return 0

    def exit_code(self, oid: str) -> int | None:
        try:
            return parse_exit_code(self.exit_file(oid).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def exit_time(self, oid: str) -> int:
        """When conmon wrote the exit file (ns): the exit time of an exit we missed."""
        return self.exit_file(oid).stat().st_mtime_ns

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
        with contextlib.suppress(InvalidArgument):  # handler removed from config since
            await self.runtime(handler).delete(oid, force=True)
        shutil.rmtree(self.bundle_dir(oid), ignore_errors=True)
        self.exit_file(oid).unlink(missing_ok=True)
        self._exited.pop(oid, None)

    async def reopen_log(self, oid: str, log_path: Path) -> None:
        await conmon.reopen_log(self.bundle_dir(oid), log_path)

