"""One lifecycle event per transition, however many clients race for it."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e
RACERS = 10


class EventLog:
    """GetContainerEvents read in a thread; `until` waits for a marker pod's CREATED,
    which (events being published in order) means every earlier event is in."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.stream = node.cri.runtime.GetContainerEvents(pb.GetEventsRequest())
        self.got: list[tuple[str, int]] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for ev in self.stream:
                with self.cond:
                    self.got.append((ev.container_id, ev.container_event_type))
                    self.cond.notify_all()
        except grpc.RpcError:
            pass

    def until_marker(self) -> Counter[tuple[str, int]]:
        marker, _ = self.node.run_pod("marker")
        with self.cond:
            assert self.cond.wait_for(
                lambda: (marker, pb.CONTAINER_CREATED_EVENT) in self.got, timeout=60
            ), self.got
            return Counter(self.got)

    def close(self) -> None:
        self.stream.cancel()
        self.thread.join(10)


def test_concurrent_rmp_f_reports_each_transition_once(node: Node) -> None:
    events = EventLog(node)
    try:
        sid, cfg = node.run_pod("racy")
        running = node.run(sid, cfg, "running", ["sleep", "1000"])
        created = node.create(sid, cfg, "created", ["sleep", "1000"])

        def rmp_f(_: int) -> None:
            rt = node.cri.runtime
            rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
            rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))

        with ThreadPoolExecutor(RACERS) as pool:
            list(pool.map(rmp_f, range(RACERS)))
        seen = events.until_marker()
    finally:
        events.close()
    for oid in (sid, running, created):
        assert seen[(oid, pb.CONTAINER_DELETED_EVENT)] == 1, (oid, seen)
    assert seen[(sid, pb.CONTAINER_STOPPED_EVENT)] == 1, seen
    assert seen[(running, pb.CONTAINER_STOPPED_EVENT)] == 1, seen
    assert node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers == []


def test_concurrent_container_transitions_report_once(node: Node) -> None:
    sid, cfg = node.run_pod("racy-ctr")
    events = EventLog(node)
    try:
        cid = node.create(sid, cfg, "c", ["sleep", "1000"])
        rt = node.cri.runtime

        def race(call: object) -> None:
            with ThreadPoolExecutor(RACERS) as pool:
                for f in [pool.submit(call) for _ in range(RACERS)]:  # type: ignore[arg-type]
                    try:
                        f.result()
                    except grpc.RpcError as e:  # losers of a start race are told why
                        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e

        race(lambda: rt.StartContainer(pb.StartContainerRequest(container_id=cid)))
        race(lambda: rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0)))
        race(lambda: rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid)))
        seen = events.until_marker()
    finally:
        events.close()
    for kind in (pb.CONTAINER_CREATED_EVENT, pb.CONTAINER_STARTED_EVENT,
                 pb.CONTAINER_STOPPED_EVENT, pb.CONTAINER_DELETED_EVENT):
        assert seen[(cid, kind)] == 1, (kind, seen)
