"""What an operator sees of a running pycri: the Prometheus endpoint (`metrics_address`)
and the one info line per state-changing CRI call, in text and JSON log formats."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pycri.api import api_pb2 as pb
from pycri.streaming import portforward
from tests.e2e.conftest import Node
from tests.streaming import client

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _configure(node: Node, line: str) -> None:
    with open(node.proc.config) as f:
        text = f.read()
    # Top-level keys must come before the first [table] of the TOML file.
    node.proc.config.write_text(f"{line}\n{text}")
    node.restart()


def _scrape(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def _sessions_while_forwarding(url: str, address: str) -> float:
    """The sessions gauge while a port-forward session is open."""
    session, _ = await client.upgrade(url, [portforward.PROTOCOL])
    try:
        return _get(await asyncio.to_thread(_scrape, address), "pycri_streaming_sessions")
    finally:
        await session.close(linger=0)


def _listening_ports(pid: int) -> set[int]:
    """TCP ports the process `pid` listens on (its socket inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if m := re.fullmatch(r"socket:\[(\d+)\]", target):
            inodes.add(m.group(1))
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in list(f)[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def test_metrics_move_with_the_cri_calls(node: Node) -> None:
    address = f"127.0.0.1:{_free_port()}"
    _configure(node, f'metrics_address = "{address}"')
    assert node.proc.proc is not None
    assert int(address.rsplit(":", 1)[1]) in _listening_ports(node.proc.proc.pid)
    before = _scrape(address)
    assert _get(before, "pycri_process_resident_memory_bytes") > 0
    assert _get(before, "pycri_process_open_fds") > 0
    assert _get(before, "pycri_image_pull_bytes_total") == 0

    # A pull that fetches blobs (the image is removed first) and one that fails.
    node.cri.image.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=node.image)))
    node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=node.image)))
    absent = node.image.rsplit(":", 1)[0] + ":no-such-tag"
    with pytest.raises(grpc.RpcError) as exc:
        node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=absent)))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND

    sid, pod = node.run_pod("metrics")
    cid = node.run(sid, pod, "sleeper", ["sleep", "300"])
    running = _scrape(address)
    assert _get(running, "pycri_pods", state="ready") == 1
    assert _get(running, "pycri_containers", state="running") == 1
    assert _get(running, "pycri_conmon_processes") == 2  # the infra and the sleeper
    assert _get(running, "pycri_streaming_sessions") == 0
    url = node.cri.runtime.PortForward(pb.PortForwardRequest(pod_sandbox_id=sid, port=[80])).url
    assert asyncio.run(_sessions_while_forwarding(url, address)) == 1
    deadline = time.monotonic() + 10
    while _get(_scrape(address), "pycri_streaming_sessions") != 0:
        assert time.monotonic() < deadline, "the closed session is still counted"
        time.sleep(0.1)

    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1))
    with pytest.raises(grpc.RpcError):
        node.cri.runtime.StartContainer(pb.StartContainerRequest(container_id="f" * 64))
    after = _scrape(address)
    assert _get(after, "pycri_containers", state="exited") == 1
    assert _get(after, "pycri_containers", state="running") == 0
    assert _get(after, "pycri_conmon_processes") == 1
    for method in ("RunPodSandbox", "CreateContainer", "StartContainer", "StopContainer",
                   "PullImage", "RemoveImage"):
        assert _get(after, "pycri_rpc_duration_seconds_count", method=method) >= 1, method
        assert _get(after, "pycri_rpc_duration_seconds_sum", method=method) > 0, method
    assert _get(after, "pycri_rpc_duration_seconds_count", method="PullImage") == 2
    assert _get(after, "pycri_rpc_errors_total", method="PullImage", code="NOT_FOUND") == 1
    assert _get(after, "pycri_rpc_errors_total", method="StartContainer", code="NOT_FOUND") == 1
    assert _get(after, "pycri_rpc_errors_total", method="RunPodSandbox", code="NOT_FOUND") == 0
    assert _get(after, "pycri_image_pull_duration_seconds_count") == 2
    assert _get(after, "pycri_image_pull_failures_total") == 1
    assert _get(after, "pycri_image_pull_bytes_total") > 100_000  # busybox's layer
    for action in ("create", "start", "kill"):
        assert _get(after, "pycri_oci_runtime_duration_seconds_count", runtime="runc",
                    action=action) >= 1, action
    assert _get(after, "pycri_cni_plugin_duration_seconds_count", plugin="bridge",
                command="ADD") == 1
    assert _get(after, "pycri_cni_plugin_errors_total", plugin="bridge", command="ADD") == 0
    # The bucket counts are cumulative and end in the total.
    assert _get(after, "pycri_rpc_duration_seconds_bucket", method="StopContainer",
                le="+Inf") == _get(after, "pycri_rpc_duration_seconds_count",
                                   method="StopContainer")


def test_no_metrics_endpoint_by_default(node: Node) -> None:
    assert node.proc.proc is not None
    ports = _listening_ports(node.proc.proc.pid)
    assert len(ports) == 1, ports  # the streaming server's, nothing else


def _lifecycle(node: Node, name: str) -> tuple[str, str]:
    sid, pod = node.run_pod(name)
    cid = node.run(sid, pod, "worker", ["sleep", "300"])
    node.cri.runtime.ListContainers(pb.ListContainersRequest())
    node.cri.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=cid))
    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1))
    node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
    with pytest.raises(grpc.RpcError):
        node.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=cid))
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    return sid, cid


def _new_lines(log: Path, start: int) -> list[str]:
    return log.read_text(errors="replace")[start:].splitlines()


def test_state_changes_are_logged_in_text(node: Node) -> None:
    start = len(node.proc.log_text())
    sid, cid = _lifecycle(node, "oplog-text")
    lines = [line for line in _new_lines(node.proc.log, start) if " INFO pycri.rpc: " in line]

    def line(rpc: str, *needles: str) -> str:
        found = [x for x in lines if f"pycri.rpc: {rpc} " in x and all(n in x for n in needles)]
        assert len(found) == 1, (rpc, needles, lines)
        return found[0]

    run = line("RunPodSandbox", f"pod_id={sid}", "pod=e2e/oplog-text", "outcome=OK")
    assert re.search(r" duration_s=\d+\.\d+ ", run), run
    line("CreateContainer", f"container_id={cid}", "container=worker", f"pod_id={sid}",
         "outcome=OK")
    line("StartContainer", f"container_id={cid}", "container=worker", "outcome=OK")
    line("StopContainer", f"container_id={cid}", "container=worker", "pod=e2e/oplog-text")
    line("RemoveContainer", f"container_id={cid}", "container=worker", "outcome=OK")
    failed = line("StartContainer", f"container_id={cid}", "outcome=NOT_FOUND")
    assert "error=" in failed, failed
    line("StopPodSandbox", f"pod_id={sid}", "pod=e2e/oplog-text", "outcome=OK")
    line("RemovePodSandbox", f"pod_id={sid}", "pod=e2e/oplog-text", "outcome=OK")
    # Read-only calls stay off the info log (they are the hot path).
    assert not [x for x in lines if re.search(r"pycri\.rpc: (List|ContainerStatus)", x)]


def test_state_changes_are_logged_in_json(node: Node) -> None:
    _configure(node, 'log_format = "json"')
    start = len(node.proc.log_text())
    sid, cid = _lifecycle(node, "oplog-json")
    entries = []
    for raw in _new_lines(node.proc.log, start):
        if raw.startswith("{"):
            entry = json.loads(raw)
            if entry["level"] == "info" and "rpc" in entry:
                entries.append(entry)
    by_rpc: dict[str, list[dict[str, object]]] = {}
    for e in entries:
        by_rpc.setdefault(str(e["rpc"]), []).append(e)
    assert set(by_rpc) == {"RunPodSandbox", "CreateContainer", "StartContainer",
                           "StopContainer", "RemoveContainer", "StopPodSandbox",
                           "RemovePodSandbox"}, by_rpc.keys()
    (run,) = by_rpc["RunPodSandbox"]
    assert run["pod_id"] == sid and run["pod"] == "e2e/oplog-json" and run["outcome"] == "OK"
    assert isinstance(run["duration_s"], float) and run["duration_s"] > 0
    (create,) = by_rpc["CreateContainer"]
    assert create["container_id"] == cid and create["container"] == "worker"
    assert create["pod_id"] == sid
    ok, failed = by_rpc["StartContainer"]
    assert ok["outcome"] == "OK" and ok["container"] == "worker"
    assert failed["outcome"] == "NOT_FOUND" and failed["container_id"] == cid
    assert "error" in failed and "error" not in ok
    (stop,) = by_rpc["StopContainer"]
    assert stop["container"] == "worker" and stop["pod"] == "e2e/oplog-json"
