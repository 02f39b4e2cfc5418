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

from pycri.stats.cgroups import CGROUP_ROOT, relative_dir, unified_dir

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
    dirs = _hierarchy_dirs(root, rel)
    left = _procs(dirs)
    if not left:
        return 0
    unified = unified_dir(root, rel)
    with contextlib.suppress(OSError):
        (unified / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + timeout
    while _procs(dirs):
        if time.monotonic() > deadline:
            log.warning(
                "cgroup of %s still holds %s after %ss", owner, sorted(_procs(dirs)), timeout
            )
            break
        with _frozen(root, rel, unified):
            for pid in _procs(dirs):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(_ROUND_PAUSE)
    log.info("killed what container %s left running (%d processes)", owner, len(left))
    return len(left)


def _hierarchy_dirs(root: Path, rel: str) -> list[Path]:
    """The cgroup's directory in every mounted hierarchy that has it."""
    if (root / "cgroup.controllers").exists():  # pure v2
        candidates = [root / rel]
    else:
        candidates = [h / rel for h in root.iterdir() if h.is_dir() and not h.is_symlink()]
    return [d for d in candidates if (d / "cgroup.procs").is_file()]


def _procs(dirs: list[Path]) -> set[int]:
    pids: set[int] = set()
    for d in dirs:
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
    return pids


@contextlib.contextmanager
def _frozen(root: Path, rel: str, unified: Path) -> Iterator[None]:
    """Freeze the cgroup for the body (best effort: no freezer, no freeze), then thaw."""
    v1 = root / "freezer" / rel / "freezer.state"
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
