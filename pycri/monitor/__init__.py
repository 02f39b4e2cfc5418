"""Container monitoring: conmon, exit files, ExecSync and reaping re-parented monitors."""

from pycri.monitor.conmon import Created, create, oom_killed, reopen_log, resize
from pycri.monitor.execsync import ExecResult, ExecTimeout, exec_sync
from pycri.monitor.exits import ExitWatcher
from pycri.monitor.reaper import Reaper, become_subreaper

__all__ = [
    "Created",
    "ExecResult",
    "ExecTimeout",
    "ExitWatcher",
    "Reaper",
    "become_subreaper",
    "create",
    "exec_sync",
    "oom_killed",
    "reopen_log",
    "resize",
]
