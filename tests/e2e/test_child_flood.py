"""A flood of child exits while RPCs are served (issue 16).

The runtime handler is real runc behind a wrapper that leaves orphans behind on every
call: they are re-parented to the daemon (a child subreaper) and exit a moment later,
thousands of them, while hundreds of runtime calls go through pycri's own spawn path
and other clients keep asking. Every RPC must be answered, no zombie may stay, the
daemon's log must hold no wakeup-fd warning (a SIGCHLD per exit used to fill the
loop's wakeup pipe), and no more runtime calls may run at once than configured.
"""

from __future__ import annotations

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

pytestmark = pytest.mark.e2e

MAX_CONCURRENT = 4
ORPHANS_PER_CALL = 10
CONTAINERS = 16
UPDATES_PER_CONTAINER = 6

_WRAPPER = """#!/bin/sh
# runc, counting the calls running at once; every call pycri makes directly (not
# create or exec, which run under conmon) leaves {orphans} orphans that exit soon after.
sub=""
skip=0
for a in "$@"; do
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  case "$a" in
    --root|--log|--log-format) skip=1 ;;
    -*) ;;
    *) sub="$a"; break ;;
  esac
done
[ "$sub" = exec ] || {{ mkdir "{dir}/running/$$"; ls "{dir}/running" | wc -l >> "{dir}/counts"; }}
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

    def __init__(self, node: Node, sid: str, cids: list[str]) -> None:
        self.calls: list[Callable[[], object]] = [
            lambda: node.cri.runtime.Version(pb.VersionRequest(), timeout=30),
            lambda: node.cri.runtime.Status(pb.StatusRequest(), timeout=30),
            lambda: node.cri.runtime.ListContainers(pb.ListContainersRequest(), timeout=30),
            lambda: node.cri.runtime.PodSandboxStatus(
                pb.PodSandboxStatusRequest(pod_sandbox_id=sid), timeout=30),
            *(lambda c=c: node.cri.runtime.ContainerStatus(  # type: ignore[misc]
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
    node.add_runtime("flood", _WRAPPER.format(dir=work, orphans=ORPHANS_PER_CALL))
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
            readers = Readers(node, sid, cids)
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
    assert "wakeup fd" not in node.proc.log_text()
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
