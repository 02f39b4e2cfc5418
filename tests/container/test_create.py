"""The create pipeline's undo (pycri/container/create.py): a CreateContainer that fails
at its last step, the runtime's `create`, after the record, the rootfs snapshot, an
image volume, a staged recursive read-only mount and the bundle were made, leaves none
of them behind, and the name is free for the retry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.lib.faults import HangingRuntime, hang_handler

pytestmark = pytest.mark.e2e

CLIENT_WAIT = 120


@pytest.fixture
def failing(node: Node, tmp_path: Path) -> Iterator[HangingRuntime]:
    """Runtime handler "hang" on `node`: runc, failing the subcommands switched on."""
    with hang_handler(node.proc.config, tmp_path / "failing-runtime", node.tmp / "state",
                      30) as rt:
        node.restart()
        yield rt


def mounted(node: Node) -> list[str]:
    with open("/proc/mounts") as f:
        return sorted(line.split()[1] for line in f if str(node.tmp) in line.split()[1])


def entries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []



def test_a_create_failing_at_the_runtime_leaves_nothing_and_the_name_free(
    node: Node, failing: HangingRuntime, tmp_path: Path
) -> None:
    pod = node.pod_config("undo")
    sid = node.cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(
        config=pod, runtime_handler="hang"), timeout=CLIENT_WAIT).pod_sandbox_id
    host = tmp_path / "host-dir"
    host.mkdir()
    cfg = node.container_config("c", ["sleep", "1000"], mounts=[
        pb.Mount(container_path="/img", image=pb.ImageSpec(image=node.image), readonly=True),
        pb.Mount(container_path="/rro", host_path=str(host), readonly=True,
                 recursive_read_only=True),
    ])
    request = pb.CreateContainerRequest(pod_sandbox_id=sid, config=cfg, sandbox_config=pod)
    state, root = node.tmp / "state", node.tmp / "root"
    before = (mounted(node), entries(root / "snapshots"), entries(state / "bundles"))
    rows = node.stored()

    failing.fail("create")
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.CreateContainer(request, timeout=CLIENT_WAIT)
    assert "creating the container" in (e.value.details() or ""), e.value.details()
    assert "injected create failure" in (e.value.details() or ""), e.value.details()

    assert list(node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers) == []
    assert (mounted(node), entries(root / "snapshots"), entries(state / "bundles")) == before
    assert entries(state / "rro") == []  # no staged copy left
    assert node.stored() == rows  # no record, even after a restart

    failing.release()
    cid = node.cri.runtime.CreateContainer(request, timeout=CLIENT_WAIT).container_id
    node.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=cid),
                                    timeout=CLIENT_WAIT)
    assert node.status(cid).state == pb.CONTAINER_RUNNING
    assert node.exec(cid, "cat", "/img/etc/motd").stdout == b"pycri test image\n"
