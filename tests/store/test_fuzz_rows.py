"""The door for stored state, fuzzed (issue 38, item 6): rows of a real database,
mutated by type, depth, size, truncation and encoding, and the daemon started over
each. It must start, keep serving the good records, answer every list and status call
with a domain code (never INTERNAL or UNKNOWN), and stop cleanly.

Bounded for CI (PYCRI_FUZZ_ROWS examples, 12 by default); hack/fuzz-rows.sh runs it
longer."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pycri.api import api_pb2 as pb
from pycri.store import Store
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox
from tests.conftest import PycriProcess

EXAMPLES = int(os.environ.get("PYCRI_FUZZ_ROWS", "12"))
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
SID, GOOD_SID, CID = "1" * 64, "2" * 64, "3" * 64


def _seed(db: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """A database as pycri writes it: two stopped pods, an exited container."""
    now = time.time_ns()
    store = Store(db)

    def pod(sid: str, name: str) -> Sandbox:
        return Sandbox(id=sid, config=pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace="fuzz", uid=name),
            labels={"app": name}), handler="runc", runtime_handler="", created_at=now,
            network_torn_down=True)

    for sb in (pod(SID, "mutated"), pod(GOOD_SID, "good")):
        store.put("sandbox", sb.id, sb.to_record())
    c = Container(id=CID, sandbox_id=SID, config=pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image="busybox")),
        image_id="sha256:" + "4" * 64, image_ref="busybox", handler="runc", created_at=now,
        log_path="", state=pb.CONTAINER_EXITED, finished_at=now, exit_code=3)
    store.put("container", CID, c.to_record())
    rows = {(k, i): r for k in ("sandbox", "container") for i, r in store.items(k)}
    store.close()
    return rows


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)


@st.composite
def mutations(draw: st.DrawFn, rows: dict[tuple[str, str], dict[str, Any]]) -> tuple[
        str, str, str | bytes]:  # fmt: skip
    """(kind, id, new data) for one row (never GOOD_SID's: it must stay served)."""
    kind, rid = draw(st.sampled_from(sorted(k for k in rows if k[1] != GOOD_SID)))
    record = dict(rows[(kind, rid)])
    text = json.dumps(record)
    how = draw(st.sampled_from(["retype", "drop", "truncate", "deep", "utf8", "huge", "text"]))
    if how == "retype":
        record[draw(st.sampled_from(sorted(record)))] = draw(json_values)
    elif how == "drop":
        del record[draw(st.sampled_from(sorted(record)))]
    elif how == "truncate":
        return kind, rid, text[: draw(st.integers(0, len(text) - 1))]
    elif how == "deep":
        n = draw(st.integers(33, 200_000))
        return kind, rid, "[" * n + "]" * n
    elif how == "utf8":
        return kind, rid, text.encode()[:10] + b"\xff\xfe" + text.encode()[10:]
    elif how == "huge":
        record[draw(st.sampled_from(sorted(record)))] = "x" * draw(st.integers(1, 3 << 20))
    else:
        return kind, rid, draw(st.text(max_size=40))
    return kind, rid, json.dumps(record)


def _answers(call: Any, request: Any) -> None:
    try:
        call(request)
    except grpc.RpcError as e:
        assert e.code() not in BAD, f"{type(request).__name__}: {e.code()} {e.details()}"


def test_the_daemon_starts_over_any_mutated_row(pycri_dirs: PycriProcess,
                                                tmp_path: Path) -> None:
    pristine = tmp_path / "pristine.db"
    rows = _seed(pristine)
    db = pycri_dirs.root / "pycri.db"

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(mutations(rows))
    def one(mutation: tuple[str, str, str | bytes]) -> None:
        kind, rid, data = mutation
        shutil.rmtree(pycri_dirs.root, ignore_errors=True)
        pycri_dirs.root.mkdir(mode=0o700)
        shutil.copy(pristine, db)
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE records SET data = ? WHERE kind = ? AND id = ?",
                         (data, kind, rid))
        conn.close()
        started = time.monotonic()
        pycri_dirs.start()
        try:
            assert time.monotonic() - started < 30
            cri = pycri_dirs.client()
            rt = cri.runtime
            pods = rt.ListPodSandbox(pb.ListPodSandboxRequest()).items
            assert GOOD_SID in {p.id for p in pods}  # the good record is served
            for p in pods:
                _answers(rt.PodSandboxStatus, pb.PodSandboxStatusRequest(pod_sandbox_id=p.id,
                                                                         verbose=True))
            for c in rt.ListContainers(pb.ListContainersRequest()).containers:
                _answers(rt.ContainerStatus, pb.ContainerStatusRequest(container_id=c.id,
                                                                       verbose=True))
            _answers(rt.ListContainerStats, pb.ListContainerStatsRequest())
            _answers(rt.ListPodSandboxStats, pb.ListPodSandboxStatsRequest())
            _answers(cri.image.ListImages, pb.ListImagesRequest())
            _answers(cri.image.ImageFsInfo, pb.ImageFsInfoRequest())
            _answers(rt.Status, pb.StatusRequest(verbose=True))
            # What a kubelet does to a pod it no longer wants: it goes, or is gone.
            for sid in (SID, GOOD_SID):
                _answers(rt.StopPodSandbox, pb.StopPodSandboxRequest(pod_sandbox_id=sid))
                _answers(rt.RemovePodSandbox, pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
            cri.channel.close()
        finally:
            assert pycri_dirs.stop() == 0, pycri_dirs.log_text()[-3000:]

    one()
