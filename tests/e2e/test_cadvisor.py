"""The cAdvisor door of a real node (issue 44): what cAdvisor's containerd plugin asks,
asked the way it asks (tests/cadvisor/client.py), answered from the node's records."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from pycri.cadvisor.api import containerd_pb2 as ctrd
from tests.cadvisor.client import CONTAINERS_GET, CadvisorClient
from tests.e2e.conftest import Node

LIST = "/containerd.services.containers.v1.Containers/List"
DELETE = "/containerd.services.containers.v1.Containers/Delete"


def door(node: Node) -> Path:
    return node.tmp / "state" / "cadvisor" / "containerd.sock"


@pytest.fixture
def client(node: Node) -> CadvisorClient:
    c = CadvisorClient(door(node))
    yield c  # type: ignore[misc]
    c.close()


def _kubelet_labels(name: str, pod: pb.PodSandboxConfig) -> dict[str, str]:
    return {"io.kubernetes.container.name": name,
            "io.kubernetes.pod.name": pod.metadata.name,
            "io.kubernetes.pod.namespace": pod.metadata.namespace,
            "io.kubernetes.pod.uid": pod.metadata.uid}


def _pod(node: Node, name: str) -> tuple[str, pb.PodSandboxConfig]:
    return node.run_pod(name, labels={"io.kubernetes.pod.name": name,
                                      "io.kubernetes.pod.namespace": "e2e",
                                      "io.kubernetes.pod.uid": f"uid-{name}", "app": "web"})


def test_every_running_container_and_pod_with_labels_image_pid_and_cgroup(
        node: Node, client: CadvisorClient) -> None:  # fmt: skip
    assert client.version().startswith("pycri-")
    sid, pod = _pod(node, "seen")
    cids = [node.run(sid, pod, n, ["sleep", "60"], labels=_kubelet_labels(n, pod))
            for n in ("app", "sidecar")]
    for cid, name in zip(cids, ("app", "sidecar"), strict=True):
        c = client.container(cid)
        assert c.id == cid and c.sandbox == sid
        assert c.labels["io.kubernetes.container.name"] == name
        assert c.labels["io.kubernetes.pod.name"] == "seen"
        assert c.labels["io.kubernetes.pod.namespace"] == "e2e"
        assert c.labels["io.cri-containerd.kind"] == "container"
        assert c.image == node.image  # the tag it was pulled by, as containerd names it
        spec = json.loads(c.spec.value)  # the OCI spec it runs with, whole
        assert spec["process"]["args"] == ["sleep", "60"]
        cgroup = spec["linux"]["cgroupsPath"]
        assert os.path.basename(cgroup) == cid  # how the kubelet joins cAdvisor to the CRI
        assert c.created_at.ToNanoseconds() == node.status(cid).created_at
        task = client.task(cid)
        assert task.status == ctrd.RUNNING
        assert task.pid == _pid(node, cid)
        assert cgroup.lstrip("/") in Path(f"/proc/{task.pid}/cgroup").read_text()
    infra = client.container(sid)
    assert infra.labels["io.cri-containerd.kind"] == "sandbox"  # cAdvisor's "has network"
    assert infra.labels["io.kubernetes.pod.name"] == "seen"
    assert infra.labels["app"] == "web"
    assert "io.kubernetes.container.name" not in infra.labels
    task = client.task(sid)
    assert task.status == ctrd.RUNNING
    # cAdvisor reads the pod's network through this pid: it is in the pod's netns.
    assert os.stat(f"/proc/{task.pid}/ns/net").st_ino == os.stat(_netns(node, sid)).st_ino


def _pid(node: Node, cid: str) -> int:
    st = node.cri.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=cid,
                                                                    verbose=True))
    return int(json.loads(st.info["info"])["pid"])


def _netns(node: Node, sid: str) -> str:
    st = node.cri.runtime.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=sid,
                                                                      verbose=True))
    return str(json.loads(st.info["info"])["netnsPath"])


def test_an_exited_container_is_stopped_and_a_removed_one_is_gone(
        node: Node, client: CadvisorClient) -> None:  # fmt: skip
    sid, pod = _pod(node, "gone")
    cid = node.run(sid, pod, "quick", ["sh", "-c", "exit 3"])
    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=5))
    task = client.task(cid)
    assert task.status == ctrd.STOPPED and task.exit_status == 3
    node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
    for ask in (client.container, client.task):
        with pytest.raises(grpc.RpcError) as e:
            ask(cid)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    assert client.task(sid).status == ctrd.STOPPED
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    with pytest.raises(grpc.RpcError) as e:
        client.container(sid)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_only_what_cadvisor_asks_is_answered(node: Node, client: CadvisorClient) -> None:
    sid, _ = _pod(node, "asked")
    # Another namespace holds nothing; no namespace is containerd's FailedPrecondition.
    with pytest.raises(grpc.RpcError) as e:
        client.call(CONTAINERS_GET, ctrd.GetContainerRequest(id=sid), ctrd.GetContainerResponse,
                    metadata=(("containerd-namespace", "moby"),))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        client.call(CONTAINERS_GET, ctrd.GetContainerRequest(id=sid), ctrd.GetContainerResponse,
                    metadata=None)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # An ID prefix is not an ID (containerd's Get is exact), nor is a path.
    for bad in (sid[:12], "", "../" + sid, sid + "\n"):
        with pytest.raises(grpc.RpcError) as e:
            client.container(bad)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND, bad
    # Every other method: UNIMPLEMENTED, and nothing changed.
    for method in (LIST, DELETE, "/containerd.services.tasks.v1.Tasks/Kill",
                   "/containerd.services.images.v1.Images/List"):
        with pytest.raises(grpc.RpcError) as e:
            client.call(method, ctrd.GetContainerRequest(id=sid), ctrd.GetContainerResponse)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED, method
    assert node.pod_status(sid).state == pb.SANDBOX_READY


def test_the_door_is_root_only_and_bounded(node: Node, client: CadvisorClient) -> None:
    sock = door(node)
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    sid, _ = _pod(node, "bounded")
    # A huge request is refused before it is read whole.
    with pytest.raises(grpc.RpcError) as e:
        client.container("a" * (1 << 20))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # A flood of calls on many connections: each answered or refused, none hangs, and the
    # daemon still answers both doors after it.
    def ask(_: int) -> grpc.StatusCode:
        c = CadvisorClient(sock)
        try:
            c.container(sid)
            return grpc.StatusCode.OK
        except grpc.RpcError as err:
            return err.code()  # type: ignore[no-any-return]
        finally:
            c.close()
    with ThreadPoolExecutor(32) as pool:
        codes = set(pool.map(ask, range(400)))
    assert codes <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert grpc.StatusCode.OK in codes
    # Half-open connections that never speak HTTP/2 do not stop the door.
    idle = []
    for _ in range(64):
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(sock))
        s.sendall(b"\0" * 7)
        idle.append(s)
    try:
        done = threading.Event()
        result: list[str] = []
        def late() -> None:
            result.append(client.container(sid).id)
            done.set()
        threading.Thread(target=late, daemon=True).start()
        assert done.wait(10) and result == [sid]
    finally:
        for s in idle:
            s.close()
    assert node.pod_status(sid).state == pb.SANDBOX_READY


def test_the_door_goes_with_the_daemon(node: Node) -> None:
    sock = door(node)
    assert sock.exists()
    node.proc.stop()
    assert not sock.exists()
    node.proc.start()
    c = CadvisorClient(sock)
    try:
        assert c.version().startswith("pycri-")
    finally:
        c.close()


def test_what_a_kubelet_takes_from_the_cri_with_the_gate_on(
        node: Node, client: CadvisorClient) -> None:  # fmt: skip
    """PodAndContainerStatsFromCRI: the kubelet's /metrics/cadvisor is ListPodSandboxMetrics
    and its Summary the CRI stats. Created by image ID, as a kubelet creates, every
    container is still labelled with its image's tag, and the pod has its network and
    memory usage, RSS and page faults."""
    image_id = node.cri.image.ImageStatus(pb.ImageStatusRequest(
        image=pb.ImageSpec(image=node.image))).image.id
    sid, pod = _pod(node, "gate")
    cids = {}
    for n in ("app", "sidecar"):
        config = node.container_config(
            n, ["sh", "-c", f"head -c 4000000 /dev/zero >/dev/shm/{n} && touch /done; sleep 60"],
            labels=_kubelet_labels(n, pod))
        config.image.image = image_id
        cids[n] = node.cri.runtime.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=sid, config=config, sandbox_config=pod)).container_id
        node.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=cids[n]))
    for cid in cids.values():
        node.wait_for_file(cid, "/done")
    assert client.container(cids["app"]).image == node.image  # the door says the same
    gateway = node.subnet.rsplit(".", 1)[0] + ".1"
    assert node.exec(cids["app"], "ping", "-c", "1", "-W", "2", gateway).exit_code == 0

    entry = next(p for p in node.cri.runtime.ListPodSandboxMetrics(
        pb.ListPodSandboxMetricsRequest()).pod_metrics if p.pod_sandbox_id == sid)
    for c in entry.container_metrics:
        name = next(n for n, cid in cids.items() if cid == c.container_id)
        seen = {m.name: list(m.label_values) for m in c.metrics}
        for metric in ("container_cpu_usage_seconds_total", "container_memory_working_set_bytes",
                       "container_memory_rss"):
            assert seen[metric][:5] == ["gate", "e2e", name, c.container_id, node.image], metric
    assert {m.name for m in entry.metrics} >= {"container_network_receive_bytes_total"}

    stats = node.cri.runtime.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=sid)).stats
    linux = stats.linux
    assert [i.name for i in linux.network.interfaces] == ["eth0"]
    assert linux.network.interfaces[0].rx_bytes.value > 0
    memory = linux.memory
    assert memory.usage_bytes.value >= 8_000_000  # both containers' files in the pod's shm
    assert memory.rss_bytes.value > 0 and memory.page_faults.value > 0
    assert memory.HasField("major_page_faults")
    assert {c.attributes.id for c in linux.containers} == set(cids.values())
    assert all(c.memory.working_set_bytes.value > 0 for c in linux.containers)
