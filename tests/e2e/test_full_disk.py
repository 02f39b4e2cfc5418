"""A node whose root filesystem is full (issue 38, item 5): every call that creates
answers RESOURCE_EXHAUSTED naming the filesystem and leaves nothing half-made, and the
kubelet can still stop and remove what runs (the database's reserve is given back).
Before, RunPodSandbox and CreateContainer answered INTERNAL `OperationalError: database
or disk is full`.

The node's root is a tmpfs of the test's own (over images.free_space_reserve, 256 MiB), filled
to the last byte."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node, running_node


@pytest.fixture
def small_root_node(tmp_path: Path, busybox: str) -> Iterator[Node]:
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=320m,mode=0700", "tmpfs", str(root)],
                   check=True)
    try:
        with running_node(tmp_path, busybox) as node:
            yield node
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


@contextlib.contextmanager
def filled(fs: Path) -> Iterator[None]:
    """`fs` full to the last page while inside; emptied again after."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
        yield
    finally:
        os.close(fd)
        filler.unlink()


def _code_and_message(call: object, request: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call(request)  # type: ignore[operator]
    return e.value.code(), e.value.details() or ""


def test_a_full_disk_is_resource_exhausted_and_leaves_nothing(small_root_node: Node) -> None:
    node = small_root_node
    root = node.tmp / "root"
    assert (root / "pycri.db.reserve").stat().st_blocks * 512 >= 8 << 20  # allocated
    sid, pod = node.run_pod("before")
    cid = node.run(sid, pod, "c", ["sleep", "600"])
    pods_before = sorted(os.listdir(root / "sandboxes"))
    netns_before = sorted(os.listdir("/run/netns"))
    full = f"no space left on the filesystem mounted at {root}"

    with filled(root):
        code, message = _code_and_message(
            node.cri.runtime.RunPodSandbox,
            pb.RunPodSandboxRequest(config=node.pod_config("during")))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, message
        assert full in message, message
        assert [p.id for p in node.cri.runtime.ListPodSandbox(
            pb.ListPodSandboxRequest()).items] == [sid]
        assert sorted(os.listdir(root / "sandboxes")) == pods_before
        assert sorted(os.listdir("/run/netns")) == netns_before

        code, message = _code_and_message(
            node.cri.runtime.CreateContainer, pb.CreateContainerRequest(
                pod_sandbox_id=sid, config=node.container_config("d", ["true"]),
                sandbox_config=pod))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, message
        assert full in message, message
        assert [c.id for c in node.cri.runtime.ListContainers(
            pb.ListContainersRequest()).containers] == [cid]

        # What runs can still be stopped and removed: a kubelet frees a full node so.
        # The database's reserve is given back for it (and comes back with space).
        node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
        node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
        assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
        assert not (root / "pycri.db.reserve").exists()
        assert "released the database's reserve" in node.proc.log_text()

    # Space again: the node works as before, and a restart finds nothing stale.
    sid2, pod2 = node.run_pod("after")
    assert (root / "pycri.db.reserve").stat().st_size == 8 << 20
    node.run(sid2, pod2, "c", ["sleep", "600"])
    node.restart()
    assert [p.id for p in node.cri.runtime.ListPodSandbox(
        pb.ListPodSandboxRequest()).items] == [sid2]
