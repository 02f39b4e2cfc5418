"""A real, unmodified kubelet on a pycri node (issue 44): its built-in cAdvisor names
every pycri container in /metrics/cadvisor and /stats/summary, with the feature gates
at their defaults (PodAndContainerStatsFromCRI off) and with the gate on.

The kubelet runs standalone (a static pod, no API server), its read-only port on
loopback, its pod cgroups below a cgroup root of the test's own, its iptables chains
off; everything it made is removed afterwards. It is told the door's socket with
--containerd: the default path is the host's, which a test never takes. Needs a kubelet
binary (PYCRI_TEST_KUBELET, else `kubelet` on PATH); skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.lib import tools
from tests.lib.registry import free_port

CAPABILITY = "a real kubelet's cAdvisor view of pycri's containers"
HOST_DIRS = (Path("/var/lib/kubelet"), Path("/var/log/pods"))
DEADLINE = 150.0  # s: the kubelet's start, the pod's, and cAdvisor's first housekeeping


class Kubelet:
    def __init__(self, binary: str, node: Node, tmp: Path, gates: str) -> None:
        self.tmp, self.node = tmp, node
        self.port = free_port()
        self.cgroup_root = f"/pycri-e2e-kubelet-{secrets.token_hex(3)}"
        self.manifests = tmp / "manifests"
        self.manifests.mkdir(parents=True)
        sock = node.tmp / "state" / "pycri.sock"
        self.argv = [
            binary,
            f"--container-runtime-endpoint=unix://{sock}",
            f"--containerd={node.tmp / 'state' / 'cadvisor' / 'containerd.sock'}",
            f"--root-dir={tmp / 'kubelet'}", f"--cert-dir={tmp / 'pki'}",
            f"--pod-manifest-path={self.manifests}",
            "--hostname-override=pycri-e2e", "--address=127.0.0.1",
            f"--port={free_port()}", f"--read-only-port={self.port}", "--healthz-port=0",
            "--cgroup-driver=cgroupfs", f"--cgroup-root={self.cgroup_root}",
            "--fail-swap-on=false", "--make-iptables-util-chains=false",
            "--eviction-hard=", "--image-gc-high-threshold=100",
            "--housekeeping-interval=2s", "--v=2",
        ]
        if gates:
            self.argv.append(f"--feature-gates={gates}")
        self.cri_stats = "PodAndContainerStatsFromCRI=true" in gates
        self.log = tmp / "kubelet.log"
        # Host dirs any kubelet makes whatever its flags; removed after if it made them.
        self.host_dirs = [d for d in HOST_DIRS if not d.exists()]
        self.proc: subprocess.Popen[bytes] | None = None

    def hierarchies(self) -> list[Path]:
        """Our cgroup root in every mounted hierarchy (the kubelet wants it in each)."""
        return [h / self.cgroup_root.lstrip("/") for h in Path("/sys/fs/cgroup").iterdir()
                if (h / "cgroup.procs").exists()]

    def start(self) -> None:
        for root in self.hierarchies():
            root.mkdir()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return str(r.read().decode())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cleanup(self) -> None:
        """The kubelet's leftovers: its cgroups below our root, pod log dirs, mounts."""
        for root in self.hierarchies():
            if not root.is_dir():
                continue
            for d in sorted((p for p in root.rglob("*") if p.is_dir()),
                            key=lambda p: len(p.parts), reverse=True):
                d.rmdir()
            root.rmdir()
        for pod_logs in Path("/var/log/pods").glob("e2e-kubelet_*"):
            shutil.rmtree(pod_logs, ignore_errors=True)
        for d in self.host_dirs:
            shutil.rmtree(d, ignore_errors=True)
        with open("/proc/mounts") as f:
            mounts = [line.split()[1] for line in f if str(self.tmp) in line.split()[1]]
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], check=False)


@pytest.fixture(params=["", "PodAndContainerStatsFromCRI=true"], ids=["default", "cri-stats"])
def kubelet(request: pytest.FixtureRequest, node: Node, tmp_path: Path) -> Iterator[Kubelet]:
    binary = tools.require("kubelet", CAPABILITY)
    k = Kubelet(binary, node, tmp_path / "k", request.param)
    try:
        k.start()
        yield k
    finally:
        k.stop()
        node.remove_all()
        k.cleanup()


def _static_pod(k: Kubelet, image: str) -> None:
    (k.manifests / "web.json").write_text(json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "e2e-kubelet"},
        "spec": {"containers": [
            {"name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
             # Memory it touches (RSS) and packets in its network (the pod's counters).
             "command": ["sh", "-c", "dd if=/dev/zero bs=1M count=8 | cat >/dev/shm/x; "
                         "ping -c 3 -W 1 127.0.0.1 >/dev/null; sleep 3600"]},
            {"name": "sidecar", "image": image, "imagePullPolicy": "IfNotPresent",
             "command": ["sleep", "3600"]},
        ]},
    }))


def _series(metrics: str, name: str) -> list[dict[str, str]]:
    out = []
    for line in metrics.splitlines():
        if line.startswith(name + "{"):
            labels = line[len(name) + 1:line.rindex("}")]
            out.append(dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels)))
    return out


def _wait(k: Kubelet, ready: Any, what: str) -> Any:
    deadline = time.monotonic() + DEADLINE
    last: object = None
    while time.monotonic() < deadline:
        assert k.proc is not None and k.proc.poll() is None, k.log.read_text()[-4000:]
        try:
            last = ready()
            if last:
                return last
        except (OSError, ValueError, KeyError) as e:
            last = e
        time.sleep(2)
    pytest.fail(f"{what} never came: {last!r}\n{k.log.read_text()[-3000:]}")


def test_the_kubelet_sees_every_pycri_container(kubelet: Kubelet, node: Node) -> None:
    _static_pod(kubelet, node.image)
    names = {"app", "sidecar"}

    def labelled() -> bool:
        text = kubelet.get("/metrics/cadvisor")
        for metric in ("container_cpu_usage_seconds_total",
                       "container_memory_working_set_bytes", "container_memory_rss"):
            seen = {s["container"] for s in _series(text, metric)
                    if s.get("pod") == "web-pycri-e2e" and s.get("namespace") == "e2e-kubelet"
                    and s.get("image") == node.image}
            if seen != names:
                return False
        net = [s for s in _series(text, "container_network_receive_bytes_total")
               if s.get("pod") == "web-pycri-e2e" and s.get("namespace") == "e2e-kubelet"]
        return bool(net)
    _wait(kubelet, labelled, "labelled container_* series in /metrics/cadvisor")

    def summary() -> dict[str, Any] | None:
        doc = json.loads(kubelet.get("/stats/summary"))
        pods = [p for p in doc.get("pods", []) if p["podRef"]["name"] == "web-pycri-e2e"]
        if not pods:
            return None
        pod = pods[0]
        ctrs = {c["name"]: c for c in pod.get("containers", [])}
        if set(ctrs) != names or not pod.get("network", {}).get("interfaces"):
            return None
        mem_fields = ("usageBytes", "workingSetBytes", "rssBytes", "pageFaults",
                      "majorPageFaults")
        # From the CRI a kubelet takes a container's working set only, and the rest for
        # the pod (kubelet 1.28 makeContainerStats, addCRIPodMemoryStats).
        per_container = ("workingSetBytes",) if kubelet.cri_stats else mem_fields
        if not all(f in c.get("memory", {}) for c in ctrs.values() for f in per_container):
            return None
        if kubelet.cri_stats and not all(f in pod.get("memory", {}) for f in mem_fields):
            return None
        return pod
    pod = _wait(kubelet, summary, "every container's memory and the pod's network in "
                "/stats/summary")
    app = next(c for c in pod["containers"] if c["name"] == "app")
    memory = pod["memory"] if kubelet.cri_stats else app["memory"]
    assert memory["usageBytes"] >= 8 << 20  # the 8 MiB it wrote to /dev/shm
    assert memory["rssBytes"] > 0 and memory["pageFaults"] > 0
    assert pod["network"]["name"] == "eth0" and pod["network"]["rxBytes"] > 0

    # The sandbox the kubelet sees is pycri's, by the ID the CRI gives it.
    [sb] = node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest(
        filter=pb.PodSandboxFilter(label_selector={"io.kubernetes.pod.name": "web-pycri-e2e"}),
    )).items
    text = kubelet.get("/metrics/cadvisor")
    assert any(s.get("id", "").endswith(sb.id) for s in _series(
        text, "container_network_receive_bytes_total")), "the pod's network is its infra's"
    assert os.path.isdir(f"/sys/fs/cgroup/memory{kubelet.cgroup_root}") or os.path.isdir(
        f"/sys/fs/cgroup{kubelet.cgroup_root}")
