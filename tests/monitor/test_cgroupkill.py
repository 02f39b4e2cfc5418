"""kill_leftovers against real cgroups (v1 hierarchies and the unified one on this host)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

from pycri.monitor.cgroupkill import kill_leftovers
from tests.monitor.ocibundle import CGROUP_ROOT, pid_alive, remove_cgroup_tree

HIERARCHIES = ("freezer", "pids", "memory", "unified")


@pytest.fixture
def cgroup() -> Iterator[str]:
    """A fresh `pycri-<id>` cgroup in the hierarchies above (those mounted here)."""
    name = f"pycri-test-{uuid.uuid4().hex[:12]}"
    for h in HIERARCHIES:
        if (CGROUP_ROOT / h).is_dir():
            (CGROUP_ROOT / h / name).mkdir()
    try:
        yield name
    finally:
        remove_cgroup_tree(name)


def _join(name: str, pid: int, hierarchies: tuple[str, ...] = HIERARCHIES) -> None:
    for h in hierarchies:
        procs = CGROUP_ROOT / h / name / "cgroup.procs"
        if procs.exists():
            procs.write_text(str(pid))


def _members(name: str) -> set[int]:
    out: set[int] = set()
    for h in HIERARCHIES:
        with contextlib.suppress(OSError):
            out |= {int(p) for p in (CGROUP_ROOT / h / name / "cgroup.procs").read_text().split()}
    return out


@pytest.mark.parametrize("hierarchies", [HIERARCHIES, ("freezer", "pids", "memory")],
                         ids=["with-unified", "v1-only"])
def test_kills_a_forking_tree_until_the_cgroup_is_empty(
    cgroup: str, hierarchies: tuple[str, ...]
) -> None:
    """A shell that keeps forking sleepers: a single read-then-kill round would miss
    some. In v1 only, the unified cgroup.kill cannot reach them: freeze-and-kill does."""
    p = subprocess.Popen(["/bin/sh", "-c", "while :; do sleep 1000 & done"])
    try:
        _join(cgroup, p.pid, hierarchies)
        deadline = time.monotonic() + 10
        while len(_members(cgroup)) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(_members(cgroup)) >= 20
        assert kill_leftovers(f"/{cgroup}", cgroup.removeprefix("pycri-")) >= 20
        assert _members(cgroup) == set()
        p.wait(10)
        assert p.returncode == -9
    finally:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
        p.wait()


@pytest.mark.parametrize("path", ["", "/", "/pycri", "/other-abc/pycri-xyz"])
def test_never_touches_a_cgroup_that_is_not_the_containers_own(path: str) -> None:
    """An empty or foreign path must not make it kill a parent's (or the host's) tasks."""
    me = os.getpid()
    assert kill_leftovers(path, "abc") == 0
    assert pid_alive(me)


def test_missing_cgroup_is_nothing_to_do() -> None:
    assert kill_leftovers(f"/pycri/pycri-{uuid.uuid4().hex}", "pycri") == 0


def test_frozen_state_is_thawed_after(cgroup: str) -> None:
    p = subprocess.Popen(["sleep", "1000"])
    try:
        _join(cgroup, p.pid)
        kill_leftovers(f"/{cgroup}", cgroup)
        p.wait(10)
        state = CGROUP_ROOT / "freezer" / cgroup / "freezer.state"
        if state.exists():
            assert state.read_text().strip() == "THAWED"
        freeze = CGROUP_ROOT / "unified" / cgroup / "cgroup.freeze"
        if freeze.exists():
            assert freeze.read_text().strip() == "0"
    finally:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
        p.wait()
