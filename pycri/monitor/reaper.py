"""Reap the conmon processes that get re-parented to the daemon.

pycri is a child subreaper, so when a conmon double-forks and its first process exits,
the daemonized conmon becomes our child; when it finally exits, it stays a zombie
until we wait for it. asyncio reaps its own subprocesses with one blocking
waitpid(pid) per child (ThreadedChildWatcher); a blanket waitpid(-1) here would steal
their statuses (they would see 255). So this reaper only waits for pids it was told
about: the conmon pids read from conmon's pid files.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable

import prctl

from pycri import procs

ReapCallback = Callable[[int, int], None]
"""Called as (pid, wait status) for each process reaped."""


def become_subreaper() -> None:
    """Orphaned descendants (daemonized conmons) are re-parented to us, not to init."""
    prctl.set_child_subreaper(1)


class Reaper:
    """SIGCHLD-driven reaping of tracked, re-parented pids (no polling)."""

    def __init__(self, on_reaped: ReapCallback | None = None) -> None:
        self._pids: set[int] = set()
        self._on_reaped = on_reaped
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Become a subreaper and handle SIGCHLD on the running loop."""
        become_subreaper()
        self._loop = asyncio.get_running_loop()
        self._loop.add_signal_handler(signal.SIGCHLD, self.reap)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGCHLD)
            self._loop = None

    def track(self, pid: int) -> None:
        """Reap `pid` once it exits; it may already have (SIGCHLD came before we knew it)."""
        self._pids.add(pid)
        self.reap()

    @property
    def tracked(self) -> frozenset[int]:
        return frozenset(self._pids)

    def reap(self) -> None:
        """Collect every tracked pid that has exited; drop pids that are not our children.
        Members of killed helper process groups (pycri.procs) are collected too."""
        procs.reap_orphans()
        for pid in list(self._pids):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                # Not (or no longer) our child: re-parented elsewhere or reaped already.
                self._pids.discard(pid)
                continue
            if done == 0:
                continue
            self._pids.discard(pid)
            if self._on_reaped is not None:
                with contextlib.suppress(Exception):
                    self._on_reaped(pid, status)
