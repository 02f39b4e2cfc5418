"""The six Stream* lists end to end: on a node holding more of each object than one
chunk (the chunk bound set small in the config), every stream sends several bounded
messages whose items, joined, are what the unary list answers, filters included."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.lib import images

pytestmark = pytest.mark.e2e

CHUNK_ITEMS = 2
CHUNK_BYTES = 4096
PODS = 3  # containers: 2 in each


def _joined(responses: Iterable[Message], field: str) -> list[Any]:
    """Every streamed item in order, checking each message against the chunk bounds."""
    out: list[Any] = []
    messages = 0
    for msg in responses:
        items = list(getattr(msg, field))
        assert 1 <= len(items) <= CHUNK_ITEMS, len(items)
        assert len(items) == 1 or msg.ByteSize() <= CHUNK_BYTES + 16, msg.ByteSize()
        out.extend(items)
        messages += 1
    assert messages == 0 or messages >= -(-len(out) // CHUNK_ITEMS)
    return out


@pytest.fixture
def crowded(node: Node, registry: Any, tmp_path: Path) -> tuple[Node, list[str], list[str]]:
    """The node with small chunks, PODS pods of two sleeping containers each, and three
    images; returns the pod and container IDs."""
    with open(node.proc.config, "a") as f:
        f.write(f"[lists]\nstream_chunk_items = {CHUNK_ITEMS}\n"
                f"stream_chunk_bytes = {CHUNK_BYTES}\n")
    node.restart()
    for n in range(2):
        ref = images.push_busybox(registry.addr, tmp_path / f"layout{n}", tag=f"stream{n}",
                                  env=[f"N={n}"])
        node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)))
    pods, ctrs = [], []
    for p in range(PODS):
        sid, cfg = node.run_pod(f"stream{p}", labels={"group": "even" if p % 2 == 0 else "odd"})
        pods.append(sid)
        for c in range(2):
            ctrs.append(node.run(sid, cfg, f"c{c}", ["sleep", "3600"]))
    return node, pods, ctrs


def _ids(items: Iterable[Any], key: Callable[[Any], str]) -> list[str]:
    return [key(i) for i in items]


def test_pods_and_containers_stream_as_their_lists(
    crowded: tuple[Node, list[str], list[str]],
) -> None:
    node, pods, ctrs = crowded
    rt = node.cri.runtime
    for flt in (None, pb.PodSandboxFilter(label_selector={"group": "even"}),
                pb.PodSandboxFilter(id=pods[1][:12])):
        unary = rt.ListPodSandbox(pb.ListPodSandboxRequest(filter=flt)).items
        streamed = _joined(rt.StreamPodSandboxes(pb.StreamPodSandboxesRequest(filter=flt)),
                           "pod_sandboxes")
        assert streamed == list(unary)
    assert len(_joined(rt.StreamPodSandboxes(pb.StreamPodSandboxesRequest()),
                       "pod_sandboxes")) == PODS
    for cflt in (None, pb.ContainerFilter(pod_sandbox_id=pods[2]),
                 pb.ContainerFilter(state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING),
                                    label_selector={"nothing": "matches"})):
        cunary = rt.ListContainers(pb.ListContainersRequest(filter=cflt)).containers
        cstreamed = _joined(rt.StreamContainers(pb.StreamContainersRequest(filter=cflt)),
                            "containers")
        assert cstreamed == list(cunary)
    every = _joined(rt.StreamContainers(pb.StreamContainersRequest()), "containers")
    assert sorted(c.id for c in every) == sorted(ctrs)
    third = _joined(rt.StreamContainers(pb.StreamContainersRequest(
        filter=pb.ContainerFilter(pod_sandbox_id=pods[2]))), "containers")
    assert sorted(c.id for c in third) == sorted(ctrs[4:6])


def test_stats_and_metrics_stream_as_their_lists(
    crowded: tuple[Node, list[str], list[str]],
) -> None:
    node, pods, ctrs = crowded
    rt = node.cri.runtime

    def cid(s: Any) -> str:
        return str(s.attributes.id)

    for sflt in (None, pb.ContainerStatsFilter(pod_sandbox_id=pods[0])):
        unary = rt.ListContainerStats(pb.ListContainerStatsRequest(filter=sflt)).stats
        streamed = _joined(rt.StreamContainerStats(
            pb.StreamContainerStatsRequest(filter=sflt)), "container_stats")
        assert sorted(_ids(streamed, cid)) == sorted(_ids(unary, cid))
        assert all(s.memory.working_set_bytes.value > 0 for s in streamed)
    assert sorted(_ids(_joined(rt.StreamContainerStats(pb.StreamContainerStatsRequest()),
                               "container_stats"), cid)) == sorted(ctrs)

    for pflt in (None, pb.PodSandboxStatsFilter(label_selector={"group": "odd"})):
        punary = rt.ListPodSandboxStats(pb.ListPodSandboxStatsRequest(filter=pflt)).stats
        pstreamed = _joined(rt.StreamPodSandboxStats(
            pb.StreamPodSandboxStatsRequest(filter=pflt)), "pod_sandbox_stats")
        assert sorted(_ids(pstreamed, cid)) == sorted(_ids(punary, cid))
        assert [len(p.linux.containers) for p in pstreamed] == [2] * len(pstreamed)
    assert len(pstreamed) == 1 and pstreamed[0].attributes.id == pods[1]

    munary = rt.ListPodSandboxMetrics(pb.ListPodSandboxMetricsRequest()).pod_metrics
    mstreamed = _joined(rt.StreamPodSandboxMetrics(pb.StreamPodSandboxMetricsRequest()),
                        "pod_sandbox_metrics")
    assert sorted(m.pod_sandbox_id for m in mstreamed) == sorted(pods)

    def names(ms: Iterable[Any]) -> dict[str, set[str]]:
        return {m.pod_sandbox_id: {x.name for c in m.container_metrics for x in c.metrics}
                for m in ms}

    assert names(mstreamed) == names(munary)
    # A pod's metrics outgrow the byte bound: the bound, not the count, cut this stream.
    assert all(m.ByteSize() > CHUNK_BYTES for m in mstreamed)


def test_images_stream_as_their_list(crowded: tuple[Node, list[str], list[str]]) -> None:
    node = crowded[0]
    img = node.cri.image
    unary = img.ListImages(pb.ListImagesRequest()).images
    assert len(unary) == 3
    assert _joined(img.StreamImages(pb.StreamImagesRequest()), "images") == list(unary)
    flt = pb.ImageFilter(image=pb.ImageSpec(image=unary[1].repo_tags[0]))
    one = _joined(img.StreamImages(pb.StreamImagesRequest(filter=flt)), "images")
    assert one == list(img.ListImages(pb.ListImagesRequest(filter=flt)).images)
    assert [i.id for i in one] == [unary[1].id]


def test_streamed_lists_pass_the_request_gate(node: Node) -> None:
    """A malformed filter is refused as the unary list refuses it, before any item."""
    bad = pb.ContainerFilter(id="../x")
    with pytest.raises(grpc.RpcError) as unary:
        node.cri.runtime.ListContainers(pb.ListContainersRequest(filter=bad))
    with pytest.raises(grpc.RpcError) as streamed:
        list(node.cri.runtime.StreamContainers(pb.StreamContainersRequest(filter=bad)))
    assert streamed.value.code() == unary.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert streamed.value.details() == unary.value.details()
    assert "filter.id" in streamed.value.details()
    with pytest.raises(grpc.RpcError) as pods:
        list(node.cri.runtime.StreamPodSandboxes(pb.StreamPodSandboxesRequest(
            filter=pb.PodSandboxFilter(label_selector={"k": "v\x00"}))))
    assert pods.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert list(node.cri.runtime.StreamPodSandboxes(pb.StreamPodSandboxesRequest())) == []
