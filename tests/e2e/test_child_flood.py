"""A flood of child exits while RPCs are served (issue 16).

The runtime handler is real runc behind a wrapper that leaves orphans behind on every
call: they are re-parented to the daemon (a child subreaper) and exit a moment later,
thousands of them, while hundreds of runtime calls go through pycri's own spawn path
and other clients keep asking. Every RPC must be answered, no zombie may stay, the
daemon's log must hold no wakeup-fd warning (a SIGCHLD per exit used to fill the
loop's wakeup pipe), and no more runtime calls may run at once than configured.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.e2e.test_daemon import children
from tests.e2e.test_sandbox import chain_test_plugin
from tests.lib.faults import runtime_wrapper

pytestmark = pytest.mark.e2e

MAX_CONCURRENT = 4
ORPHANS_PER_CALL = 10
CONTAINERS = 16
UPDATES_PER_CONTAINER = 6

_BODY = """if [ "$sub" != exec ]; then
  mkdir "{dir}/running/$$"; ls "{dir}/running" | wc -l >> "{dir}/counts"
fi
if [ "$sub" != create ] && [ "$sub" != exec ]; then
  i=0
  while [ $i -lt {orphans} ]; do
    ( sleep 0.$((i % 4)) </dev/null >/dev/null 2>&1 & )
    i=$((i + 1))
  done
fi
/usr/sbin/runc "$@"
rc=$?
rmdir "{dir}/running/$$" 2>/dev/null
exit $rc
"""
_WHAT = ("runc, counting the calls running at once; every call pycri makes directly (not "
         "create or exec, which run under conmon) leaves orphans that exit soon after.")


class Orphans:
    """Samples the daemon's children: proof that the orphans were re-parented to it."""

    def __init__(self, daemon: int) -> None:
        self.daemon = daemon
        self.seen: set[int] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            self.seen |= {pid for pid, comm, _ in children(self.daemon) if comm == "sleep"}

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


class Readers:
    """Clients asking for node, pod and container state the whole time."""

    def __init__(self, node: Node, sids: list[str], cids: list[str]) -> None:
        rt = node.cri.runtime
        self.calls: list[Callable[[], object]] = [
            lambda: rt.Version(pb.VersionRequest(), timeout=30),
            lambda: rt.Status(pb.StatusRequest(), timeout=30),
            lambda: rt.ListContainers(pb.ListContainersRequest(), timeout=30),
            lambda: rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30),
            *(lambda s=s: rt.PodSandboxStatus(  # type: ignore[misc]
                pb.PodSandboxStatusRequest(pod_sandbox_id=s), timeout=30) for s in sids),
            *(lambda c=c: rt.ContainerStatus(  # type: ignore[misc]
                pb.ContainerStatusRequest(container_id=c), timeout=30) for c in cids),
        ]
        self.answered = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(3)]  # fmt: skip
        for t in self.threads:
            t.start()

    def _run(self, offset: int) -> None:
        i = offset
        while not self.stop.is_set():
            try:
                self.calls[i % len(self.calls)]()
                self.answered += 1
            except grpc.RpcError as e:
                self.errors.append(f"{e.code()}: {e.details()}")
            i += 1

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def test_flood_of_child_exits_while_serving(node: Node) -> None:
    work = node.tmp / "flood"
    (work / "running").mkdir(parents=True)
    with open(node.proc.config, "a") as f:
        f.write(f"[helpers]\nmax_concurrent = {MAX_CONCURRENT}\n")
    node.add_runtime("flood", runtime_wrapper(
        _WHAT, _BODY.format(dir=work, orphans=ORPHANS_PER_CALL)))
    assert node.proc.proc is not None
    daemon = node.proc.proc.pid
    rt = node.cri.runtime

    cfg = node.pod_config("flood")
    sid = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg, runtime_handler="flood"),
                           timeout=120).pod_sandbox_id  # fmt: skip
    orphans = Orphans(daemon)
    readers: Readers | None = None
    try:
        with ThreadPoolExecutor(8) as pool:
            cids = list(pool.map(lambda i: node.create(sid, cfg, f"c{i}", ["sleep", "1000"]),
                                 range(CONTAINERS)))  # fmt: skip
            readers = Readers(node, [sid], cids)
            # Hundreds of runtime calls at once, each leaving orphans.
            list(pool.map(lambda c: rt.StartContainer(
                pb.StartContainerRequest(container_id=c), timeout=120), cids))
            update = [pb.UpdateContainerResourcesRequest(
                container_id=c, linux=pb.LinuxContainerResources(cpu_shares=512 + n))
                for n in range(UPDATES_PER_CONTAINER) for c in cids]  # fmt: skip
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda r: rt.UpdateContainerResources(r, timeout=120), update))
            list(pool.map(lambda c: rt.StopContainer(
                pb.StopContainerRequest(container_id=c, timeout=0), timeout=120), cids))
            readers.close()  # they ask for these containers by id
            list(pool.map(lambda c: rt.RemoveContainer(
                pb.RemoveContainerRequest(container_id=c), timeout=120), cids))
    finally:
        if readers is not None:
            readers.close()
        orphans.close()

    assert readers is not None
    assert readers.errors == []
    assert readers.answered > 0
    # The orphans really were the daemon's children, hundreds of them.
    assert len(orphans.seen) >= 100, len(orphans.seen)
    # ... and none is left, not even as a zombie: only the infra's conmon remains.
    deadline = time.monotonic() + 15
    while (left := [c for c in children(daemon) if c[1] != "conmon" or c[2] == "Z"]):
        assert time.monotonic() < deadline, left
        time.sleep(0.1)
    counts = [int(n) for n in Path(work / "counts").read_text().split()]
    calls = CONTAINERS * (4 + UPDATES_PER_CONTAINER)  # create, start, updates, kill, delete
    assert len(counts) >= calls
    assert max(counts) <= MAX_CONCURRENT, max(counts)
    log = node.proc.log_text()
    assert "wakeup fd" not in log
    assert "status is lost" not in log  # no child's exit status was taken by the sweep
    # No SIGCHLD handler at all (bit 17 of the caught-signals mask).
    caught = next(line for line in Path(f"/proc/{daemon}/status").read_text().splitlines()
                  if line.startswith("SigCgt:"))  # fmt: skip
    assert not int(caught.split()[1], 16) & (1 << (signal.SIGCHLD - 1)), caught
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))


# A chained CNI plugin that passes the result on and leaves orphans behind.
_ORPHAN_PLUGIN = """#!/usr/bin/env python3
import json, subprocess, sys
conf = json.load(sys.stdin)
for i in range({orphans}):
    subprocess.Popen(["sleep", "0.%d" % (i % 4)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(json.dumps(conf.get("prevResult") or {{"cniVersion": conf["cniVersion"]}}))
"""


def test_orphans_of_cni_plugins_are_reaped(node: Node) -> None:
    """Processes a CNI plugin leaves running are re-parented to the daemon, which
    never started them; they are reaped all the same while pods come and go."""
    chain_test_plugin(node, "orphans", _ORPHAN_PLUGIN.format(orphans=20))
    assert node.proc.proc is not None
    daemon = node.proc.proc.pid
    rt = node.cri.runtime
    orphans = Orphans(daemon)
    try:
        with ThreadPoolExecutor(8) as pool:
            sids = [sid for sid, _ in pool.map(lambda i: node.run_pod(f"net{i}"), range(10))]
            readers = Readers(node, sids, [])
            try:
                list(pool.map(lambda s: rt.StopPodSandbox(
                    pb.StopPodSandboxRequest(pod_sandbox_id=s), timeout=120), sids))
            finally:
                readers.close()
            list(pool.map(lambda s: rt.RemovePodSandbox(
                pb.RemovePodSandboxRequest(pod_sandbox_id=s), timeout=120), sids))
    finally:
        orphans.close()
    assert readers.errors == [] and readers.answered > 0
    assert len(orphans.seen) >= 100, len(orphans.seen)  # ADD and DEL: 400 in all
    deadline = time.monotonic() + 15
    while left := children(daemon):  # every pod is gone: no conmon either
        assert time.monotonic() < deadline, left
        time.sleep(0.1)
