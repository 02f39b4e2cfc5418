"""ContainerConfig.stop_signal (the pod spec's lifecycle.stopSignal) end to end: the
container is stopped with it, not the image's default, and its status reports the
signal it will be stopped with."""

from __future__ import annotations

import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e

TRAPS = "trap 'exit 10' USR1; trap 'exit 15' TERM; : > /trapped; while true; do sleep 0.1; done"


def test_stop_signal_from_the_container_config(node: Node) -> None:
    sid, cfg = node.run_pod("stopsig")
    usr1 = node.run(sid, cfg, "usr1", ["sh", "-c", TRAPS], stop_signal=pb.SIGNAL_SIGUSR1)
    default = node.run(sid, cfg, "default", ["sh", "-c", TRAPS])
    assert node.status(usr1).stop_signal == pb.SIGNAL_SIGUSR1
    assert node.status(default).stop_signal == pb.SIGNAL_SIGTERM  # busybox sets none
    for cid in (usr1, default):  # the shells have installed their traps
        node.wait_for_file(cid, "/trapped")
    for cid in (usr1, default):
        node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=10))
    assert node.status(usr1).exit_code == 10
    assert node.status(default).exit_code == 15
