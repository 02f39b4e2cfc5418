"""How a record names a process: pid and start time, so a reused pid is never taken for
the process pycri started (monitor/probe.py reads them from /proc)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Identity:
    """A process as it was created: pid and start time (clock ticks after boot)."""

    pid: int
    start: int
