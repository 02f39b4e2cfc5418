"""The read path answers from bytes encoded once per record revision (server/wire.py,
server/itemcache.py): every answer must still be the live state, right after each
change, and the same message a freshly built one would be."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e


def _listed(node: Node) -> tuple[dict[str, int], dict[str, int]]:
    """Pod and container IDs to their state, as the List RPCs answer."""
    rt = node.cri.runtime
    pods = {p.id: p.state for p in rt.ListPodSandbox(pb.ListPodSandboxRequest()).items}
    ctrs = {c.id: c.state for c in rt.ListContainers(pb.ListContainersRequest()).containers}
    return pods, ctrs


def _pod_view(node: Node, sid: str, verbose: bool = False) -> pb.PodSandboxStatusResponse:
    return node.cri.runtime.PodSandboxStatus(
        pb.PodSandboxStatusRequest(pod_sandbox_id=sid, verbose=verbose))


def _wait_exited(node: Node, cid: str) -> pb.ContainerStatus:
    deadline = time.monotonic() + 15
    while (st := node.status(cid)).state != pb.CONTAINER_EXITED:
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    return st


def test_every_read_is_fresh_after_every_change(node: Node) -> None:
    rt = node.cri.runtime
    sid, cfg = node.run_pod("fresh")
    cid = node.create(sid, cfg, "c", ["sleep", "1000"], labels={"app": "a"})
    # Read everything once, so each answer is in the cache before each change.
    assert node.status(cid).state == pb.CONTAINER_CREATED
    view = _pod_view(node, sid)
    assert [c.state for c in view.containers_statuses] == [pb.CONTAINER_CREATED]
    assert _listed(node) == ({sid: pb.SANDBOX_READY}, {cid: pb.CONTAINER_CREATED})

    rt.StartContainer(pb.StartContainerRequest(container_id=cid))
    st = node.status(cid)
    assert st.state == pb.CONTAINER_RUNNING and st.started_at > 0
    assert [c.state for c in _pod_view(node, sid).containers_statuses] == [
        pb.CONTAINER_RUNNING]
    assert _listed(node)[1] == {cid: pb.CONTAINER_RUNNING}

    rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
        container_id=cid, linux=pb.LinuxContainerResources(cpu_shares=512)))
    assert node.status(cid).resources.linux.cpu_shares == 512

    # A second container joins the pod's status; an exit by itself shows at once.
    quick = node.run(sid, cfg, "quick", ["sh", "-c", "exit 3"])
    st = _wait_exited(node, quick)
    assert (st.exit_code, st.reason) == (3, "Error")
    by_id = {c.id: c for c in _pod_view(node, sid).containers_statuses}
    assert by_id.keys() == {cid, quick}
    assert (by_id[quick].state, by_id[quick].exit_code) == (pb.CONTAINER_EXITED, 3)

    rt.RemoveContainer(pb.RemoveContainerRequest(container_id=quick))
    with pytest.raises(grpc.RpcError) as e:
        node.status(quick)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert [c.id for c in _pod_view(node, sid).containers_statuses] == [cid]
    assert _listed(node)[1] == {cid: pb.CONTAINER_RUNNING}

    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    view = _pod_view(node, sid)
    assert view.status.state == pb.SANDBOX_NOTREADY
    assert view.status.network.ip == ""  # a stopped pod reports no IP
    assert [c.state for c in view.containers_statuses] == [pb.CONTAINER_EXITED]
    assert node.status(cid).state == pb.CONTAINER_EXITED
    assert _listed(node) == ({sid: pb.SANDBOX_NOTREADY}, {cid: pb.CONTAINER_EXITED})

    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    for call, req in ((rt.PodSandboxStatus, pb.PodSandboxStatusRequest(pod_sandbox_id=sid)),
                      (rt.ContainerStatus, pb.ContainerStatusRequest(container_id=cid))):
        with pytest.raises(grpc.RpcError) as e:
            call(req)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert _listed(node) == ({}, {})


def test_answers_match_their_fields_filters_and_verbose(node: Node) -> None:
    rt = node.cri.runtime
    sid, cfg = node.run_pod("fields", labels={"tier": "web"}, annotations={"a": "1"})
    other, other_cfg = node.run_pod("other")
    cid = node.run(sid, cfg, "c", ["sleep", "1000"], labels={"app": "a"})
    node.run(other, other_cfg, "d", ["sleep", "1000"])

    # Twice each: the second answer comes from the cache and must equal the first.
    for _ in range(2):
        st = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid))
        assert st.status.id == cid and st.status.labels["app"] == "a" and not st.info
        verbose = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True))
        assert verbose.status == st.status
        assert json.loads(verbose.info["info"])["pid"] > 0

        view = _pod_view(node, sid)
        assert view.status.id == sid and view.status.labels["tier"] == "web"
        assert view.status.annotations["a"] == "1" and view.status.network.ip
        assert [c.id for c in view.containers_statuses] == [cid]
        assert view.containers_statuses[0] == st.status
        assert view.timestamp > 0 and not view.info
        verbose_pod = _pod_view(node, sid, verbose=True)
        assert verbose_pod.status == view.status
        assert verbose_pod.containers_statuses == view.containers_statuses
        assert json.loads(verbose_pod.info["info"])

        by_label = rt.ListPodSandbox(pb.ListPodSandboxRequest(
            filter=pb.PodSandboxFilter(label_selector={"tier": "web"}))).items
        assert [p.id for p in by_label] == [sid]
        assert by_label[0].metadata.name == "fields"
        in_pod = rt.ListContainers(pb.ListContainersRequest(
            filter=pb.ContainerFilter(pod_sandbox_id=sid))).containers
        assert [(c.id, c.pod_sandbox_id, c.labels["app"]) for c in in_pod] == [(cid, sid, "a")]
        assert len(rt.ListContainers(pb.ListContainersRequest()).containers) == 2


def test_image_answers_follow_pull_and_remove(node: Node) -> None:
    img = node.cri.image
    spec = pb.ImageSpec(image=node.image)

    def status() -> pb.Image:
        return img.ImageStatus(pb.ImageStatusRequest(image=spec)).image

    def listed() -> list[str]:
        return [t for i in img.ListImages(pb.ListImagesRequest()).images for t in i.repo_tags]

    pulled = status()
    assert pulled.id and node.image in pulled.repo_tags and status() == pulled
    assert listed() == [node.image]
    verbose = img.ImageStatus(pb.ImageStatusRequest(image=spec, verbose=True))
    assert verbose.image == pulled and json.loads(verbose.info["info"])["repoTags"]
    img.RemoveImage(pb.RemoveImageRequest(image=spec))
    assert not status().id
    assert listed() == []
    by_ref = img.ListImages(pb.ListImagesRequest(filter=pb.ImageFilter(image=spec))).images
    assert list(by_ref) == []
    img.PullImage(pb.PullImageRequest(image=spec))
    assert status() == pulled
    assert listed() == [node.image]
    by_ref = img.ListImages(pb.ListImagesRequest(filter=pb.ImageFilter(image=spec))).images
    assert [i.id for i in by_ref] == [pulled.id]
