"""Kill what is left in an exited container's cgroup.

In its own PID namespace a container's processes die with its init (the kernel kills
the namespace). In its pod's or the host's namespace they do not: `sh -c 'sleep 777 &'`
and any exec'd process would run on, unwatched, until the container is removed. So
when a container exits, whatever is still in its cgroup gets SIGKILL, as containerd
and CRI-O do. Blocking file I/O on cgroupfs: run it in a thread.

Forks race a plain read-then-kill, so the cgroup is frozen around each round where a
freezer exists (v1 `freezer.state`, v2 `cgroup.freeze`; a frozen task cannot fork or
exit, so its pid cannot be reused either), the v2 `cgroup.kill` is used where the
kernel has it, and rounds repeat until the cgroup is empty.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from pycri.cgroups import CGROUP_ROOT, Cgroup, read_pids, relative_dir

log = logging.getLogger(__name__)

_ROUND_PAUSE = 0.01
_FREEZE_WAIT = 1.0


def kill_leftovers(
    cgroups_path: str, owner: str, *, root: Path = CGROUP_ROOT, timeout: float = 10.0
) -> int:
    """SIGKILL every process in the cgroup until it is empty; how many were there.

    `owner` (the container ID) must name the cgroup's last component: a record with an
    empty or foreign path must never make this walk a parent, or the root, cgroup.
    """
    rel = relative_dir(cgroups_path)
    if not rel or owner not in Path(rel).name or ".." in Path(rel).parts:
        log.warning(
            "not killing leftovers of %s: cgroup path %r is not its own", owner, cgroups_path
        )
        return 0
    cg = Cgroup(rel, root)
    dirs = [d for d in cg.dirs() if (d / "cgroup.procs").is_file()]
    left = _procs(dirs)
    if not left:
        return 0
    unified = Path(cg.unified)
    with contextlib.suppress(OSError):
        (unified / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + timeout
    while _procs(dirs):
        if time.monotonic() > deadline:
            log.warning(
                "cgroup of %s still holds %s after %ss", owner, sorted(_procs(dirs)), timeout
            )
            break
        with _frozen(Path(cg.dir("freezer")), unified):
            for pid in _procs(dirs):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(_ROUND_PAUSE)
    log.info("killed what container %s left running (%d processes)", owner, len(left))
    return len(left)


def _procs(dirs: list[Path]) -> set[int]:
    """The processes of the cgroup in every hierarchy that has it."""
    return {pid for d in dirs for pid in read_pids(f"{d}/cgroup.procs")}


@contextlib.contextmanager
def _frozen(freezer: Path, unified: Path) -> Iterator[None]:
    """Freeze the cgroup for the body (best effort: no freezer, no freeze), then thaw."""
    v1 = freezer / "freezer.state"
    if v1.is_file():
        knob, frozen, thawed = v1, "FROZEN", "THAWED"
    elif (unified / "cgroup.freeze").is_file():
        knob, frozen, thawed = unified / "cgroup.freeze", "1", "0"
    else:
        yield
        return
    try:
        knob.write_text(frozen)
        _await_frozen(v1, unified)
    except OSError:
        pass
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            knob.write_text(thawed)


def _await_frozen(v1: Path, unified: Path) -> None:
    """v1 passes through FREEZING, v2 reports `frozen 1` in cgroup.events once done."""
    deadline = time.monotonic() + _FREEZE_WAIT
    while time.monotonic() < deadline:
        if v1.is_file():
            if v1.read_text().strip() == "FROZEN":
                return
        elif "frozen 1" in (unified / "cgroup.events").read_text():
            return
        time.sleep(0.001)
