"""RunPodSandbox wires the network (CNI ADD) while it creates the infra process; a
failure of either, with the other still in flight, must undo both and leave nothing:
no netns, IP lease, NAT rule, CNI cache entry, mount, conmon, runtime state, cgroup,
bundle or record. Then the same pod runs.

The faults are real: runc behind the fault-injecting wrapper (tests/lib/faults.py) and
a real chained CNI plugin; each fails only once the file saying that the other step
is under way exists, so the overlap is certain, not a matter of timing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node, leftovers
from tests.e2e.test_sandbox import chain_test_plugin, host_local_leases
from tests.lib.faults import (
    HangingRuntime,
    failing_plugin,
    hang_handler,
    hanging_plugin,
    wait_gone,
)
from tests.network.helpers import nat_rules_with

pytestmark = pytest.mark.e2e

RUNTIME_TIMEOUT = 90  # never reached: each hang ends by the undo, not by the limit
CLIENT_WAIT = 120
_ID = re.compile(r"\b[0-9a-f]{64}\b")


@pytest.fixture
def faulty(node: Node, tmp_path: Path) -> Iterator[HangingRuntime]:
    """Runtime handler "hang" on `node` (switched by the test) and a chained plugin
    "chk" after bridge+portmap, a pass-through until the test rewrites it."""
    with hang_handler(node.proc.config, tmp_path / "hang-runtime", node.tmp / "state",
                      RUNTIME_TIMEOUT) as rt:
        chain_test_plugin(node, "chk", hanging_plugin("NEVER", tmp_path / "unused"))
        yield rt


def _plugin(node: Node) -> Path:
    return node.tmp / "cni-bin" / "chk"


def _run(node: Node, name: str) -> str:
    return node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=node.pod_config(name), runtime_handler="hang"),
        timeout=CLIENT_WAIT).pod_sandbox_id


def _failed_run(node: Node, name: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        _run(node, name)
    return e.value


def _runtime_ids(node: Node) -> list[str]:
    root = node.tmp / "state" / "hang"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def assert_nothing_left(node: Node, ids: set[str] | None = None, served: bool = True) -> None:
    """Nothing of pods `ids` (default: every one the node's log names) is left, anywhere;
    `served`: the node's daemon is up, and lists no pod."""
    ids = ids or set(_ID.findall(node.proc.log_text()))
    assert ids, "the failed pod's id is not known: the checks below would prove nothing"
    if served:
        assert list(node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items) == []
    assert list((node.tmp / "root" / "sandboxes").iterdir()) == []
    assert list((node.tmp / "state" / "sandboxes").glob("*")) == []
    assert list((node.tmp / "state" / "bundles").iterdir()) == []
    assert list((node.tmp / "root" / "cni-cache").rglob("*.json")) == []
    assert host_local_leases(node) == []
    assert nat_rules_with(f"e2e-{node.bridge}") == []
    assert _runtime_ids(node) == []
    assert leftovers(node.tmp, ids) == {"netns": [], "mounts": [], "conmon": [], "cgroups": []}


def assert_killed(hung: Path) -> None:
    """The plugin that hung (pids in `hung`) was killed and reaped."""
    pids = [int(p) for p in hung.read_text().split()] if hung.exists() else []
    assert pids, "the plugin never hung: the test proves nothing"
    assert wait_gone(pids, 30) == [], "the cut-off CNI plugin was left running or a zombie"


def _nothing_left_then_retry(node: Node, rt: HangingRuntime, name: str) -> None:
    """Nothing is left; with the faults gone, the same pod name runs, and stops and goes
    cleanly."""
    assert_nothing_left(node)
    rt.release()
    _plugin(node).write_text(hanging_plugin("NEVER", node.tmp / "unused"))
    sid = _run(node, name)
    assert node.pod_status(sid).state == pb.SANDBOX_READY
    assert host_local_leases(node) != []
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    assert_nothing_left(node)


def test_cni_add_failing_while_the_infra_is_created_undoes_both(
        node: Node, faulty: HangingRuntime) -> None:
    # The runtime does its create (state, `runc init` waiting), then hangs; the plugin
    # fails its ADD only once that create is done, so the infra is surely in flight.
    faulty.hang("create", after=True)
    _plugin(node).write_text(failing_plugin(faulty.dir / "done-before-hang"))
    err = _failed_run(node, "overlap")
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err.details()
    assert "injected ADD failure" in (err.details() or "")
    assert faulty.done_before_hang(), "the infra was never in flight: the test proves nothing"
    assert faulty.left() == [], "the hung runtime of the cut-off infra create was left"
    _nothing_left_then_retry(node, faulty, "overlap")


def test_infra_failing_while_cni_add_runs_undoes_both(
        node: Node, faulty: HangingRuntime) -> None:
    # The plugin hangs in its ADD (after bridge leased an IP and portmap ran); the
    # runtime's create fails only once the plugin is hanging.
    hung = node.tmp / "plugin-hung"
    _plugin(node).write_text(hanging_plugin("ADD", hung))
    faulty.fail("create", once=hung)
    err = _failed_run(node, "overlap")
    assert "injected create failure" in (err.details() or ""), err.details()
    assert faulty.entered("create").exists()
    assert_killed(hung)
    _nothing_left_then_retry(node, faulty, "overlap")


def test_run_cancelled_with_both_in_flight_leaves_nothing(
        node: Node, faulty: HangingRuntime) -> None:
    hung = node.tmp / "plugin-hung"
    _plugin(node).write_text(hanging_plugin("ADD", hung))
    faulty.hang("create", after=True)
    node.cri.channel.close()
    assert node.proc.stop() == 0  # the scenario runs a daemon of its own on the node's dirs
    p = node.proc
    argv = [sys.executable, "-m", "tests.e2e.cancel_scenario", str(p.config), str(p.root),
            str(p.state), str(p.socket), "cancelled", str(faulty.dir), str(hung)]
    with open(p.log, "ab") as log:
        scenario = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=log, text=True, cwd=Path(__file__).parents[2])
    try:
        assert scenario.stdout is not None and scenario.stdin is not None
        first = json.loads(scenario.stdout.readline() or "null")
        assert first is not None, f"the scenario failed:\n{p.log_text()[-3000:]}"
        assert first["outcome"] == "cancelled" and first["records"] == 0, first
        assert faulty.done_before_hang() == [first["id"]]
        assert faulty.left() == [], "the hung runtime of the cancelled create was left"
        assert_killed(hung)
        assert_nothing_left(node, {first["id"]}, served=False)
        faulty.release()
        _plugin(node).write_text(hanging_plugin("NEVER", node.tmp / "unused"))
        scenario.stdin.write("go\n")
        scenario.stdin.flush()
        second = json.loads(scenario.stdout.readline() or "null")
        assert second == {"ready": True, "id": second["id"], "records": 0}, second
        assert scenario.wait(60) == 0
    finally:
        if scenario.poll() is None:
            scenario.kill()
            scenario.wait()
        p.start()
        node.cri = p.client()
    assert_nothing_left(node, {first["id"], second["id"]})
