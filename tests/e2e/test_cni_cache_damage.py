"""A pod whose CNI cache was damaged (a power cut, a full disk, an editor) can still be
stopped and removed, and its network goes with it (issue 38, item 4). Before, every
StopPodSandbox answered FAILED_PRECONDITION and the kubelet retried it forever."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _wrong_types(f: Path) -> None:
    entry = json.loads(f.read_text())
    entry.update(cniArgs=["not", "a", "string"], runtimeConfig=[], netns="a\0b")
    f.write_text(json.dumps(entry))


def _fifo(f: Path) -> None:  # an open that blocked would hang the Stop
    f.unlink()
    os.mkfifo(f)


def _directory(f: Path) -> None:
    f.unlink()
    f.mkdir()


def _huge(f: Path) -> None:
    f.write_bytes(b" " * (5 << 20))


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate,
    "empty": lambda f: f.write_bytes(b""),
    "not-json": lambda f: f.write_bytes(b"\xff\xfe{garbage"),
    "not-an-object": lambda f: f.write_text("[1, 2, 3]"),
    "wrong-types": _wrong_types,
    "fifo": _fifo,
    "directory": _directory,
    "huge": _huge,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_pod_with_a_damaged_cni_cache_still_goes(node: Node, damage: str) -> None:
    sid, _ = node.run_pod("damaged", port_mappings=[pb.PortMapping(
        protocol=pb.TCP, container_port=80, host_port=0)])
    ip = node.pod_status(sid).network.ip
    leases = node.tmp / "ipam" / f"e2e-{node.bridge}"
    assert (leases / ip).exists()
    cache = node.tmp / "root" / "cni-cache" / sid
    DAMAGE[damage](cache / f"e2e-{node.bridge}.json")

    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    assert node.pod_status(sid).state == pb.SANDBOX_NOTREADY
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
    # The DEL rebuilt from the record released the address (host-local keys its lease
    # by container ID and interface); the node fixture checks netns, mounts, monitors,
    # cgroups and the portmap rules afterwards.
    assert not (leases / ip).exists()
    # The damaged cache is kept for a person to read, out of the way.
    assert not cache.exists()
    [aside] = [p for p in (cache.parent / ".set-aside").iterdir() if p.name.startswith(sid)]
    assert os.path.lexists(aside / f"e2e-{node.bridge}.json")  # a FIFO or dir included
    log = node.proc.log_text()
    assert f"sandbox {sid}: CNI cache" in log and "tearing its network down from what is known" \
        in log
    # A new pod gets an address as usual: nothing stale holds the range.
    sid2, _ = node.run_pod("after")
    assert node.pod_status(sid2).state == pb.SANDBOX_READY
