"""kill -9 of the daemon at the steps where hack/soak.py's chaos runs found a leak.

Each test leaves on disk exactly what a SIGKILL at that step leaves, restarts the
daemon and checks that the restart (or the next call) cleans it up.
"""

from __future__ import annotations

import json
import secrets
import signal

import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e


def test_cni_cache_write_cut_short_by_a_kill_is_pruned_at_restart(node: Node) -> None:
    """A kill between writing `<net>.tmp` and renaming it (the first write of a
    RunPodSandbox, before any plugin ran) left a cache directory with only the .tmp:
    every restart "released" it again and it was never removed (found by a 50-kill chaos run)."""
    sid, _ = node.run_pod("before")  # a real entry, to copy what a write looks like
    cache = node.tmp / "root" / "cni-cache"
    entry = json.loads((cache / sid / "cni-loopback.json").read_text())
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    node.proc.kill()
    vanished = secrets.token_hex(32)  # RunPodSandbox's record went with the crash's undo
    (cache / vanished).mkdir()
    entry |= {"containerId": vanished, "result": None}
    (cache / vanished / "cni-loopback.tmp").write_text(json.dumps(entry))
    node.proc.socket.unlink()
    node.proc.start()
    node.cri = node.proc.client()
    assert not (cache / vanished).exists()
    node.restart(signal.SIGKILL)  # and it stays that way
    assert list(cache.iterdir()) == []
