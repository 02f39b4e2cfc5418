"""Recovery over the records on disk (pycri/container/recovery.py): containers the store
says run, whose processes went while pycri was down, are rechecked at the next start
and recorded EXITED (lost with their state, or with their monitor), the record saved,
while the others run on untouched."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e

SLEEP = ["sleep", "1000"]


def pids(node: Node, cid: str) -> tuple[int, int]:
    """(conmon, container process) of `cid`, from its bundle."""
    monitor = node.tmp / "state" / "bundles" / cid / "monitor"
    return int((monitor / "conmon.pid").read_text()), int((monitor / "pidfile").read_text())


def kill_and_wait(*pids: int) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{p}").exists() for p in pids):
        assert time.monotonic() < deadline, "killed processes still there"
        time.sleep(0.02)


def down(node: Node) -> None:
    """pycri killed -9: nothing it would have done on a stop."""
    node.cri.channel.close()
    node.proc.kill()


def test_a_container_whose_state_went_while_pycri_was_down_is_recorded_lost(
    node: Node,
) -> None:
    sid, pod = node.run_pod("lost")
    gone = node.run(sid, pod, "gone", SLEEP)
    survivor = node.run(sid, pod, "survivor", SLEEP)
    down(node)
    # What a reboot does to one container: its processes, runtime state, bundle (and
    # with it the exit file's chance) and cgroup are gone; its record is not.
    kill_and_wait(*pids(node, gone))
    for d in (node.tmp / "state" / "runc" / gone, node.tmp / "state" / "bundles" / gone):
        for f in sorted(d.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            f.rmdir() if f.is_dir() else f.unlink()
        d.rmdir()
    for d in Path("/sys/fs/cgroup").glob(f"*/pycri/{gone}"):
        d.rmdir()
    node.start()

    st = node.status(gone)
    assert (st.state, st.exit_code, st.reason) == (pb.CONTAINER_EXITED, 255, "Unknown"), st
    assert "state was lost" in st.message
    assert node.status(survivor).state == pb.CONTAINER_RUNNING
    assert node.exec(survivor, "echo", "alive").stdout == b"alive\n"
    node.restart()  # the recheck saved what it found: the next start reads the same
    assert node.status(gone) == st
    node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=gone))
    node.run(sid, pod, "gone", SLEEP)  # its name is free again


def test_a_container_and_its_monitor_killed_while_pycri_was_down_is_recorded_exited(
    node: Node,
) -> None:
    sid, pod = node.run_pod("unwatched")
    cid = node.run(sid, pod, "c", SLEEP)
    conmon_pid, pid = pids(node, cid)
    down(node)
    kill_and_wait(conmon_pid, pid)  # no exit file: nobody was left to write it
    node.start()

    deadline = time.monotonic() + 30
    while (st := node.status(cid)).state != pb.CONTAINER_EXITED:
        assert time.monotonic() < deadline, f"still {st.state} with its processes gone"
        time.sleep(0.05)
    assert st.reason == "MonitorDied", st
    assert f"conmon, pid {conmon_pid}" in st.message and "exited too" in st.message
    assert st.finished_at >= st.started_at > 0
    node.restart()
    assert node.status(cid) == st
    node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
    assert not (node.tmp / "state" / "bundles" / cid).exists()
