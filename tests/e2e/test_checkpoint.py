"""Checkpoint/restore end to end. Where CRIU cannot work every checkpoint RPC (and
CreateContainer from an archive) answers FailedPrecondition naming what is missing and
changes nothing; the fault is a config pointing at a criu binary that is not there.
Where `criu check` passes, a counting container is checkpointed and restored into a new
pod, and must keep counting from where it was."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from pycri.api import api_pb2 as pb
from pycri.checkpoint.support import probe_criu
from pycri.config import CheckpointConfig
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e

COUNTER = ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /count; sleep 0.2; done"]


def refused(call: Callable[[Any], Any], request: Any, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as e:
        call(request)
    assert e.value.code() == code, e.value.details()
    return str(e.value.details())


def count(node: Node, cid: str) -> int:
    return int(node.exec(cid, "cat", "/count").stdout)


def test_without_criu_every_checkpoint_rpc_is_a_failed_precondition(node: Node) -> None:
    missing = node.tmp / "no-criu"
    with open(node.proc.config, "a") as f:
        f.write(f'[checkpoint]\ncriu = "{missing}"\n')
    node.restart()
    rt = node.cri.runtime
    sid, pod = node.run_pod("ckpt")
    cid = node.run(sid, pod, "counter", COUNTER)
    archive = node.tmp / "counter.tar"
    why = f"checkpoint/restore cannot work on this node: the criu binary {missing} is not there"

    details = refused(rt.CheckpointContainer, pb.CheckpointContainerRequest(
        container_id=cid, location=str(archive)), grpc.StatusCode.FAILED_PRECONDITION)
    assert details.startswith(why)
    details = refused(rt.CheckpointPod, pb.CheckpointPodRequest(
        pod_sandbox_id=sid, output_path=str(archive)), grpc.StatusCode.FAILED_PRECONDITION)
    assert details.startswith(why)
    details = refused(rt.RestorePod, pb.RestorePodRequest(
        checkpoint_path=str(archive), config=node.pod_config("restored")),
        grpc.StatusCode.FAILED_PRECONDITION)
    assert details.startswith(why)
    from_archive = node.container_config("restored", [])
    from_archive.image.image = str(archive)
    details = refused(rt.CreateContainer, pb.CreateContainerRequest(
        pod_sandbox_id=sid, config=from_archive, sandbox_config=pod),
        grpc.StatusCode.FAILED_PRECONDITION)
    assert details.startswith(why)

    # Nothing changed: no archive, no new pod or container, the counter still counting.
    assert not archive.exists()
    assert [p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest()).items] == [sid]
    assert [c.id for c in rt.ListContainers(pb.ListContainersRequest()).containers] == [cid]
    assert node.status(cid).state == pb.CONTAINER_RUNNING
    before = count(node, cid)
    time.sleep(0.6)
    assert count(node, cid) > before


def test_checkpoint_rpcs_name_what_they_cannot_find_or_accept(node: Node) -> None:
    rt = node.cri.runtime
    sid, _ = node.run_pod("ckpt-args")
    location = str(node.tmp / "c.tar")
    refused(rt.CheckpointContainer, pb.CheckpointContainerRequest(
        container_id="0123456789ab", location=location), grpc.StatusCode.NOT_FOUND)
    refused(rt.CheckpointPod, pb.CheckpointPodRequest(
        pod_sandbox_id="0123456789ab", output_path=location), grpc.StatusCode.NOT_FOUND)
    details = refused(rt.CheckpointPod, pb.CheckpointPodRequest(
        pod_sandbox_id=sid, output_path=location, container_ids=["0123456789ab"]),
        grpc.StatusCode.NOT_FOUND)
    assert "0123456789ab" in details
    details = refused(rt.CheckpointContainer, pb.CheckpointContainerRequest(
        container_id=sid, location="relative.tar"), grpc.StatusCode.INVALID_ARGUMENT)
    assert details.startswith("location: must be an absolute")


CRIU_PROBLEM = asyncio.run(probe_criu(CheckpointConfig())).problem


@pytest.mark.skipif(bool(CRIU_PROBLEM), reason=f"CRIU cannot work here: {CRIU_PROBLEM}")
def test_a_checkpointed_counter_keeps_counting_in_a_new_pod(node: Node, tmp_path: Path) -> None:
    rt = node.cri.runtime
    sid, pod = node.run_pod("ckpt-src")
    cid = node.run(sid, pod, "counter", COUNTER)
    time.sleep(3)  # ~15 counted: a restart from scratch could not have reached it
    archive = tmp_path / "counter.tar"
    rt.CheckpointContainer(pb.CheckpointContainerRequest(container_id=cid,
                                                         location=str(archive)))
    assert archive.is_file()
    assert node.status(cid).state == pb.CONTAINER_RUNNING  # left running
    at_checkpoint = count(node, cid)
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))

    new_sid, new_pod = node.run_pod("ckpt-dst")
    restored = node.container_config("counter", [])
    restored.image.image = str(archive)
    new_cid = rt.CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=new_sid, config=restored, sandbox_config=new_pod)).container_id
    rt.StartContainer(pb.StartContainerRequest(container_id=new_cid))
    first = count(node, new_cid)
    assert first >= at_checkpoint - 5  # memory restored: not counting again from 1
    time.sleep(0.6)
    assert count(node, new_cid) > first
