"""A damaged database is rebuilt from the node, and the pods that run survive it (issue
38, item 2). Before, a truncated database file stopped the daemon at start, and every
pod on the node went unmanaged."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from pycri.api import api_pb2 as pb
from pycri.monitor.conmon import is_monitor_of as conmon_of
from tests.e2e.conftest import Node


def _wait_exited(node: Node, cid: str) -> pb.ContainerStatus:
    deadline = time.monotonic() + 15
    while (st := node.status(cid)).state != pb.CONTAINER_EXITED:
        assert time.monotonic() < deadline, f"{cid} never exited"
        time.sleep(0.05)
    return st


def _pids(node: Node, cid: str, sid: str) -> tuple[int, int]:
    """The container's and its pod's infra's pid, with their start times checked live."""
    info = node.cri.runtime.ContainerStatus(pb.ContainerStatusRequest(
        container_id=cid, verbose=True)).info["info"]
    pod = node.cri.runtime.PodSandboxStatus(pb.PodSandboxStatusRequest(
        pod_sandbox_id=sid, verbose=True)).info["info"]
    pids = json.loads(info)["pid"], json.loads(pod)["pid"]
    assert all(Path(f"/proc/{p}").exists() for p in pids)
    return pids


def _pod_cut_short(node: Node) -> str:
    """What a RunPodSandbox killed before its infra's bundle leaves: pod files, a
    /dev/shm mount and a pinned network namespace (its record went with the database)."""
    sid = "e" * 64
    (node.tmp / "root" / "sandboxes" / sid).mkdir(parents=True)
    (node.tmp / "root" / "sandboxes" / sid / "hostname").write_text("cut-short\n")
    shm = node.tmp / "state" / "sandboxes" / sid / "shm"
    shm.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "shm", str(shm)], check=True)
    subprocess.run(["ip", "netns", "add", f"pycri-{sid}"], check=True)
    return sid


def _pod_cut_short_left(node: Node, sid: str) -> list[str]:
    paths = [node.tmp / "root" / "sandboxes" / sid, node.tmp / "state" / "sandboxes" / sid,
             Path("/run/netns") / f"pycri-{sid}"]
    left = [str(p) for p in paths if p.exists()]
    with open("/proc/mounts") as f:
        left += [m for line in f if sid in (m := line.split()[1])]
    return left


def _same_status(before: pb.ContainerStatus, after: pb.ContainerStatus) -> None:
    for field in ("id", "metadata", "state", "created_at", "image", "image_ref", "labels",
                  "annotations", "log_path", "exit_code", "reason", "mounts"):
        assert getattr(after, field) == getattr(before, field), field


def test_a_damaged_database_is_rebuilt_from_the_node_and_its_pods_survive(node: Node) -> None:
    labels, annotations = {"app": "web", "io.kubernetes.pod.uid": "uid-survivor"}, {"a": "b"}
    sid, pod = node.run_pod("survivor", labels=labels, annotations=annotations)
    runs = node.run(sid, pod, "runs", ["sleep", "100000"], labels={"tier": "1"})
    exits = node.run(sid, pod, "exits", ["sh", "-c", "echo bye; exit 3"])
    created = node.create(sid, pod, "created", ["sleep", "100000"])
    stopped, _ = node.run_pod("stopped")
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=stopped))
    host, _ = node.run_pod("host", linux=pb.LinuxPodSandboxConfig(
        security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(network=pb.NODE))))
    before = {cid: node.status(cid) for cid in (runs, created)}
    before[exits] = _wait_exited(node, exits)
    pod_before = node.pod_status(sid)
    image = node.cri.image.ImageStatus(pb.ImageStatusRequest(
        image=pb.ImageSpec(image=node.image))).image
    pids = _pids(node, runs, sid)

    node.cri.channel.close()
    assert node.proc.stop() == 0  # pods and containers run on
    db = node.tmp / "root" / "pycri.db"
    db.write_bytes(b"\x00not a database" * 600)
    cut_short = _pod_cut_short(node)
    damaged = db.read_bytes()
    node.start()

    [aside] = [p for p in db.parent.iterdir() if p.name.startswith("pycri.db.damaged-")]
    assert aside.read_bytes() == damaged
    assert "rebuilt the records of 3 pods, 3 containers and 1 images" in node.proc.log_text()
    assert _pod_cut_short_left(node, cut_short) == []
    pods = {p.id: p for p in node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items}
    assert {sid: pods[sid].state, stopped: pods[stopped].state, host: pods[host].state} == {
        sid: pb.SANDBOX_READY, stopped: pb.SANDBOX_NOTREADY, host: pb.SANDBOX_READY}
    after = node.pod_status(sid)
    for field in ("metadata", "created_at", "labels", "annotations", "network", "linux"):
        assert getattr(after, field) == getattr(pod_before, field), field
    assert after.network.ip

    # Containers: the same, in their real states, and driven as before.
    states = {c.id: c.state for c in node.cri.runtime.ListContainers(
        pb.ListContainersRequest()).containers}
    assert states == {runs: pb.CONTAINER_RUNNING, exits: pb.CONTAINER_EXITED,
                      created: pb.CONTAINER_CREATED}
    for cid, st in before.items():
        _same_status(st, node.status(cid))
    assert abs(node.status(runs).started_at - before[runs].started_at) < 2 * 10**9
    assert _pids(node, runs, sid) == pids  # the very processes, still running
    assert node.exec(runs, "echo", "alive").stdout == b"alive\n"
    node.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=created))
    assert node.status(created).state == pb.CONTAINER_RUNNING
    assert (node.log_dir / "survivor" / "exits.log").read_text().count("bye") == 1

    # The image, found again by its ID with the repo digest its containers name; its tag
    # is only in the lost records, and a pull names it again.
    found = node.cri.image.ImageStatus(pb.ImageStatusRequest(
        image=pb.ImageSpec(image=image.id))).image
    assert found.id == image.id and found.size == image.size
    assert list(found.repo_digests) == list(image.repo_digests) and not found.repo_tags
    node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=node.image)))
    assert node.cri.image.ImageStatus(pb.ImageStatusRequest(
        image=pb.ImageSpec(image=node.image))).image.repo_tags == image.repo_tags

    # Everything goes as it would have: the node fixture checks netns, mounts, monitors,
    # cgroups and NAT rules after removing every pod; the address lease goes too.
    lease = node.tmp / "ipam" / f"e2e-{node.bridge}" / after.network.ip
    assert lease.exists()
    for pod_id in (sid, stopped, host):
        node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
        node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    assert not lease.exists()
    assert not list((node.tmp / "state" / "bundles").iterdir())
    assert not list((node.tmp / "root" / "snapshots").iterdir())
    node.run_pod("after")  # and the node runs new pods


def test_a_bundle_without_a_usable_record_is_named_and_the_rest_rebuilt(node: Node) -> None:
    sid, pod = node.run_pod("kept")
    runs = node.run(sid, pod, "runs", ["sleep", "100000"])
    bundles = node.tmp / "state" / "bundles"
    (bundles / runs / "record.json").write_bytes(b'{"format": 1, "kind": "container"')
    node.cri.channel.close()
    assert node.proc.stop() == 0
    (node.tmp / "root" / "pycri.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    node.start()
    log = node.proc.log_text()
    assert f"bundle {bundles / runs} has no usable record (ValueError: is not valid JSON" in log
    assert "rebuilt the records of 1 pods, 0 containers" in log
    assert node.pod_status(sid).state == pb.SANDBOX_READY
    assert not node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers
    # Its process is not pycri's to manage any more: ended by hand, as a person reading
    # the log would (its conmon then exits).
    subprocess.run(["runc", "--root", str(node.tmp / "state" / "runc"), "delete", "--force",
                    runs], check=True, capture_output=True)
    conmon = int((bundles / runs / "monitor" / "conmon.pid").read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{conmon}").exists() and conmon_of(conmon, runs):
        assert time.monotonic() < deadline, "its conmon never exited"
        time.sleep(0.05)
