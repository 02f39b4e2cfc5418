"""What the disk says about a container's (or pod infra's) process, without running anything.

After a restart pycri learns each process's state from facts: conmon's exit file (the
exit code), the bundle (gone after a reboot), and the process itself, named by its
pid *and* its start time (field 22 of /proc/<pid>/stat, recorded when it was
created), so a pid reused by an unrelated process is never taken for it. Only where
these facts say nothing (no start time recorded, a CREATED container that may have
been started) does anyone need to ask the OCI runtime.

Everything here is plain file reads: call it from a worker thread.
"""

from __future__ import annotations

import enum
import os
import select
from dataclasses import dataclass
from pathlib import Path

from pycri.store.identity import Identity


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat, None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its end.
    fields = stat.rsplit(b")", 1)[-1].split()
    try:
        return int(fields[19])  # fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


def started_ns(start: int) -> int:
    """A process's start time (clock ticks after boot) in ns since the epoch, to the
    second of the boot time (/proc/stat's btime); 0 if that cannot be read."""
    try:
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0
    return btime * 10**9 + start * 10**9 // os.sysconf("SC_CLK_TCK")


def identity_of(pid: int) -> Identity | None:
    """The identity of the live process `pid` (read when pycri has just created it)."""
    start = start_time(pid) if pid > 0 else None
    return None if start is None else Identity(pid, start)


def is_same(ident: Identity) -> bool:
    """Whether the pid still names that process, running or a zombie (then whoever it
    was re-parented to must still reap it)."""
    return start_time(ident.pid) == ident.start


def is_alive(ident: Identity) -> bool:
    """Whether that very process still runs. A pidfd pins the process found at the pid:
    if the start time read after opening it matches, the pidfd is ours, and it says
    whether the process has exited (a zombie nobody has reaped yet has)."""
    try:
        pidfd = os.pidfd_open(ident.pid)
    except ProcessLookupError:
        return False
    try:
        exited = select.select([pidfd], [], [], 0)[0]
        return not exited and is_same(ident)
    finally:
        os.close(pidfd)


class Fact(enum.Enum):
    EXITED = "exited"  # conmon wrote the exit file: code and time are known
    LOST = "lost"  # no bundle: the state went with a reboot
    RUNS = "runs"  # the process is there (created or running: not told apart)
    GONE = "gone"  # the process is not there, and conmon has not written the exit file
    UNKNOWN = "unknown"  # no start time recorded: only the runtime can tell


@dataclass(frozen=True)
class Probe:
    fact: Fact
    exit_code: int = 0
    finished_at: int = 0  # ns, the exit file's mtime
    conmon_pid: int = 0
    conmon_alive: bool = False
    # pycri froze the processes (checkpoint) and died before it thawed them.
    left_frozen: bool = False
