"""sandbox/recovery.py over the records on disk, end to end: a pod whose infra was
killed while pycri was down comes back NOTREADY (its infra's exit found on disk, or,
with its conmon gone too, its absence), the other pod READY, and both clean up."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node, leftovers

pytestmark = pytest.mark.e2e


def verbose(node: Node, sid: str) -> dict[str, object]:
    info = node.cri.runtime.PodSandboxStatus(
        pb.PodSandboxStatusRequest(pod_sandbox_id=sid, verbose=True)).info["info"]
    return json.loads(info)


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists():  # a zombie until conmon (or init) reaps it
        assert time.monotonic() < deadline, f"{pid} outlived SIGKILL"
        time.sleep(0.02)


@pytest.mark.parametrize("conmon_too", [False, True], ids=["infra", "infra+conmon"])
def test_pod_whose_infra_died_meanwhile_comes_back_notready(
        node: Node, conmon_too: bool) -> None:
    killed, _ = node.run_pod("killed")
    kept, _ = node.run_pod("kept")
    info = verbose(node, killed)
    node.cri.channel.close()
    assert node.proc.stop(signal.SIGTERM) == 0
    if conmon_too:
        kill(int(info["conmonPid"]))  # type: ignore[call-overload]
    kill(int(info["pid"]))  # type: ignore[call-overload]
    node.start()  # waits for the recheck
    assert node.pod_status(killed).state == pb.SANDBOX_NOTREADY
    assert node.pod_status(kept).state == pb.SANDBOX_READY
    assert node.pod_status(killed).network.ip == ""
    # The network stays until StopPodSandbox, which tears it down.
    assert Path(str(info["netnsPath"])).exists()
    node.remove_all()
    assert leftovers(node.tmp, {killed, kept}) == {"netns": [], "mounts": [],
                                                   "conmon": [], "cgroups": []}
