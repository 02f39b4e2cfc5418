"""sandbox/run.py's undo, end to end: a RunPodSandbox that fails at its last step (the
infra's start, refused by a real runc behind a wrapper) after every other step took
effect (pod cgroup, netns, CNI lease, pod files, /dev/shm, conmon) leaves none of them,
nor its record or its name."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node, leftovers
from tests.lib.faults import runtime_wrapper

pytestmark = pytest.mark.e2e

R = pb.LinuxContainerResources
LIMITS = pb.LinuxPodSandboxConfig(resources=R(cpu_period=100000, cpu_quota=50000,
                                              memory_limit_in_bytes=96 << 20))


def leases(node: Node) -> list[str]:
    d = node.tmp / "ipam"
    return [p.name for p in d.rglob("*") if p.name[0].isdigit()] if d.exists() else []


def refusing_start(ids: Path) -> str:
    """runc, except that `start` records the container ID and fails."""
    return runtime_wrapper("start refused", (
        'if [ "$sub" = start ]; then\n'
        f'  eval "echo \\${{$#}}" >> {ids}\n'
        '  echo "injected start failure" >&2; exit 1\n'
        'fi\n'
        'exec /usr/sbin/runc "$@"\n'))


def test_infra_start_failing_undoes_every_step(node: Node) -> None:
    ids = node.tmp / "started-ids"
    node.add_runtime("nostart", refusing_start(ids))
    cfg = node.pod_config("undone", linux=LIMITS)
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg,
                                                               runtime_handler="nostart"))
    assert "starting the infra container" in (e.value.details() or "")
    assert "injected start failure" in (e.value.details() or "")
    [sid] = ids.read_text().split()  # it got as far as the start, with this ID
    assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
    assert leftovers(node.tmp, {sid}) == {"netns": [], "mounts": [], "conmon": [],
                                          "cgroups": []}
    assert not os.path.exists(f"/run/netns/pycri-{sid}")
    assert leases(node) == []
    for d in ("root/sandboxes", "state/sandboxes", "state/bundles"):
        assert not list((node.tmp / d).glob(f"{sid}*")), d
    assert subprocess.run(["runc", "--root", str(node.tmp / "state" / "runc"), "state", sid],
                          capture_output=True).returncode != 0
    # No record on disk either: a restarted daemon knows of no pod.
    node.restart()
    assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
    # And the name is free: the same pod runs on the default handler.
    sid2, _ = node.run_pod("undone", linux=LIMITS)
    assert node.pod_status(sid2).state == pb.SANDBOX_READY
    node.remove_all()
    assert leftovers(node.tmp, {sid, sid2}) == {"netns": [], "mounts": [], "conmon": [],
                                                "cgroups": []}
    assert leases(node) == []
