"""The daemon as a process: a child subreaper that leaves no zombies behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e


def children(ppid: int) -> list[tuple[int, str, str]]:
    """(pid, comm, state) of every process whose parent is `ppid`."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, parent = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(parent) == ppid:
            out.append((int(d.name), comm, state))
    return out


def test_monitors_are_children_and_nothing_is_left_a_zombie(node: Node) -> None:
    assert node.proc.proc is not None
    daemon = node.proc.proc.pid
    sid, cfg = node.run_pod("reaper")
    cid = node.run(sid, cfg, "c", ["sleep", "1000"])
    # conmon daemonizes and is re-parented to the subreaper daemon.
    assert [c for _, c, _ in children(daemon)].count("conmon") == 2  # infra + container
    for _ in range(10):
        assert node.exec(cid, "true").exit_code == 0
    assert node.exec(cid, "sh", "-c", "sleep 100 & echo bg").stdout == b"bg\n"
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    deadline = time.monotonic() + 5
    while children(daemon) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children(daemon) == []  # monitors exited and were reaped; no zombies


def test_started_with_stdio_closed_the_daemon_and_its_children_get_dev_null(node: Node) -> None:
    """A daemon started with fds 0-2 closed (as CI runners and careless init scripts do)
    puts /dev/null there first: else its next file or socket takes fd 0, 1 or 2 and
    every child with inherited stdio (conmon, runc, CNI plugins) is handed it."""
    node.proc.launcher = ("sh", "-c", 'exec "$@" <&- >&- 2>&-', "sh")
    node.restart()
    assert node.cri.runtime.Version(pb.VersionRequest()).runtime_name == "pycri"
    assert node.proc.proc is not None
    daemon = node.proc.proc.pid
    assert [os.readlink(f"/proc/{daemon}/fd/{fd}") for fd in (0, 1, 2)] == ["/dev/null"] * 3
    sid, cfg = node.run_pod("nostdio")
    cid = node.run(sid, cfg, "c", ["sleep", "1000"])
    assert node.exec(cid, "echo", "ok").stdout == b"ok\n"
    conmons = [pid for pid, comm, _ in children(daemon) if comm == "conmon"]
    assert len(conmons) == 2
    for pid in conmons:
        assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
