"""Child exits without SIGCHLD: a pidfd per awaited process, a sweep for the orphans.

pycri is a child subreaper, so besides the processes it starts it gets children it
never started: each daemonized conmon, and whatever a runtime, CNI plugin or killed
helper group leaves behind. A SIGCHLD handler on the loop costs a byte in the
loop's wakeup fd per exit; a flood of exits filled it and once deadlocked the daemon
inside `fork` (issue 16). So no signal is used at all:

- asyncio's subprocesses are watched by `ChildWatcher` (installed as asyncio's child
  watcher): one pidfd per child on the loop, reaped when it becomes readable;
- re-parented processes whose end matters (conmons, streaming execs) are watched by
  `Reaper.watch`, also with one pidfd each, and reaped (if ours) as they exit;
- everything else is reaped by `Reaper.sweep`, run on the loop every
  `SWEEP_INTERVAL`: `waitid(P_ALL, WNOWAIT)` names the first exited child without
  reaping it, and it is reaped only if no pidfd above watches it. On the loop, so
  it never falls between asyncio's fork and its `add_child_handler`; never for a
  child someone watches, so no exit status is stolen. A process re-parented to
  pycri before its watcher knows its pid is protected by `Reaper.expecting()`.

Every child the daemon has must therefore come from asyncio (or be watched here):
a blocking `subprocess` call in a thread would have its status taken by the sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVarTuple

import prctl

log = logging.getLogger(__name__)
_Ts = TypeVarTuple("_Ts")

ReapCallback = Callable[[int, int], None]
"""Called as (pid, wait status) for each watched process reaped."""

SWEEP_INTERVAL = 1.0
"""Seconds between two sweeps: how long an orphan nobody watches may stay a zombie."""


def become_subreaper() -> None:
    """Orphaned descendants (daemonized conmons) are re-parented to us, not to init."""
    prctl.set_child_subreaper(1)


class ChildWatcher(asyncio.AbstractChildWatcher):
    """asyncio's subprocess exits through a pidfd per child on the child's own loop,
    in place of the default watcher's blocking waitpid thread per child."""

    def __init__(self) -> None:
        self._children: dict[int, tuple[int, asyncio.AbstractEventLoop,
                                        Callable[..., object], tuple[Any, ...]]] = {}  # fmt: skip

    def watching(self, pid: int) -> bool:
        return pid in self._children

    def add_child_handler(
        self, pid: int, callback: Callable[[int, int, *_Ts], object], *args: *_Ts
    ) -> None:
        loop = asyncio.get_running_loop()
        if pid in self._children:
            pidfd, loop, _, _ = self._children[pid]
        else:
            pidfd = os.pidfd_open(pid)  # a zombie still has its pid: fine here
            loop.add_reader(pidfd, self._exited, pid)
        self._children[pid] = (pidfd, loop, callback, args)

    def _exited(self, pid: int) -> None:
        pidfd, loop, callback, args = self._children[pid]
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            log.warning("child %d was reaped by someone else; its status is lost", pid)
            done, status = pid, 255 << 8
        if done == 0:
            return  # readable before waitable: wait for the next wake-up
        del self._children[pid]
        loop.remove_reader(pidfd)
        os.close(pidfd)
        callback(pid, os.waitstatus_to_exitcode(status), *args)

    def remove_child_handler(self, pid: int) -> bool:
        entry = self._children.pop(pid, None)
        if entry is None:
            return False
        entry[1].remove_reader(entry[0])
        os.close(entry[0])
        return True

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Each child is watched on the loop that started it; nothing to attach."""

    def is_active(self) -> bool:
        return True

    def close(self) -> None:
        for pid in list(self._children):
            self.remove_child_handler(pid)

    def __enter__(self) -> ChildWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


_watcher = ChildWatcher()


def install_child_watcher() -> ChildWatcher:
    """Make `ChildWatcher` asyncio's (idempotent); returns it."""
    policy = asyncio.get_event_loop_policy()
    if policy.get_child_watcher() is not _watcher:
        policy.set_child_watcher(_watcher)
    return _watcher


class Reaper:
    """Reaps what is re-parented to the daemon: watched pids at once, the rest by sweep.
    One per process (two sweeps would take each other's watched children)."""

    def __init__(self, on_reaped: ReapCallback | None = None,
                 interval: float = SWEEP_INTERVAL) -> None:  # fmt: skip
        self._on_reaped = on_reaped
        self._interval = interval
        self._watcher = _watcher
        self._watched: dict[int, tuple[int, asyncio.Future[int | None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._sweeps = 0
        self._holds: list[int] = []  # sweep count when each active hold began
        self._seen: dict[int, int] = {}  # unwatched zombie -> sweep that first saw it

    def start(self) -> None:
        """Become a subreaper, watch asyncio's children by pidfd, start sweeping."""
        become_subreaper()
        self._watcher = install_child_watcher()
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(self._interval, self._tick)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Watches end unresolved: a monitor still running must not look exited.
        for pidfd, _ in self._watched.values():
            if self._loop is not None:
                self._loop.remove_reader(pidfd)
            os.close(pidfd)
        self._watched.clear()
        self._loop = None

    # -- watched pids ------------------------------------------------------------------

    def watch(self, pid: int) -> asyncio.Future[int | None]:
        """Watch `pid` (a re-parented monitor or exec'd process, or any process) with a
        pidfd; the future, shared by all callers, gets its wait status once it has
        exited and been reaped, or None if it is gone or not our child to reap.
        A pid that already exited (a zombie) or is gone resolves at once."""
        if pid in self._watched:
            return self._watched[pid][1]
        loop = self._loop or asyncio.get_running_loop()
        fut: asyncio.Future[int | None] = loop.create_future()
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            fut.set_result(None)
            return fut
        self._watched[pid] = (pidfd, fut)
        loop.add_reader(pidfd, self._exited, pid)
        return fut

    async def wait(self, pid: int, timeout: float | None = None) -> bool:
        """Whether `pid` has exited (and, if ours, been reaped) within `timeout`."""
        try:
            await asyncio.wait_for(asyncio.shield(self.watch(pid)), timeout)
        except TimeoutError:
            return False
        return True

    async def status(self, pid: int) -> int | None:
        """The wait status of watched `pid` once it exits (None: not ours to reap)."""
        return await asyncio.shield(self.watch(pid))

    def _exited(self, pid: int) -> None:
        if self._watcher.watching(pid):  # a stale pid file naming one of asyncio's own
            self._forget(pid, None)
            return
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (a monitor of an earlier run)
            self._forget(pid, None)
            return
        if done == 0:
            return
        self._forget(pid, status)
        if self._on_reaped is not None:
            with contextlib.suppress(Exception):
                self._on_reaped(pid, status)

    def _forget(self, pid: int, status: int | None) -> None:
        pidfd, fut = self._watched.pop(pid)
        if self._loop is not None:
            self._loop.remove_reader(pidfd)
        os.close(pidfd)
        if not fut.done():
            fut.set_result(status)

    # -- orphans -------------------------------------------------------------------------

    @contextlib.contextmanager
    def expecting(self) -> Iterator[None]:
        """While held, children that exit from now on are not swept: a process about
        to be re-parented to us whose pid we learn only later (from a pid file) keeps
        its exit status for `watch`. Zombies seen before the hold are still swept."""
        began = self._sweeps
        self._holds.append(began)
        try:
            yield
        finally:
            self._holds.remove(began)

    def sweep(self) -> int:
        """Reap the exited children nobody watches; returns how many were reaped."""
        reaped = 0
        blocked = 0
        sweep, self._sweeps = self._sweeps, self._sweeps + 1
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # no children at all
                break
            if info is None:
                break
            pid = info.si_pid
            if pid in self._watched or self._watcher.watching(pid):
                break  # its own pidfd callback reaps it within this loop turn
            first = self._seen.setdefault(pid, sweep)
            if self._holds and first >= min(self._holds):
                blocked = pid  # may be the held process: wait for the hold to end
                break
            del self._seen[pid]
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            reaped += 1
        # Only the zombie that stopped this sweep is worth remembering.
        self._seen = {blocked: self._seen[blocked]} if blocked else {}
        return reaped

    def _tick(self) -> None:
        try:
            if n := self.sweep():
                log.debug("reaped %d orphaned process(es)", n)
        except Exception:
            log.exception("sweeping for orphaned processes failed")
        if self._loop is not None:
            self._timer = self._loop.call_later(self._interval, self._tick)
