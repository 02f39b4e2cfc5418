"""Fault injection against a live pycri: a hanging OCI runtime, conmon killed, a hanging
CNI plugin, the registry dying mid-pull, the metadata DB left mid-transaction.

Each fault is real: real runc behind a wrapper that hangs on demand, real conmon killed
with SIGKILL, a real chained CNI plugin, a loopback proxy that cuts the registry's
connections, a second SQLite writer killed inside its transaction.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.e2e.test_sandbox import chain_test_plugin, host_local_leases
from tests.lib import images
from tests.lib.faults import (
    DroppingProxy,
    HangingRuntime,
    hang_handler,
    hanging_plugin,
    wait_gone,
)
from tests.lib.registry import Registry
from tests.network.helpers import nat_rules_with

pytestmark = pytest.mark.e2e

# What pycri is configured to allow a runtime call; the client waits far longer, so a
# DEADLINE_EXCEEDED the test sees is pycri's own, never the client's.
RUNTIME_TIMEOUT = 4
CLIENT_WAIT = 120


def _rpc_error(call: object, *args: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(*args, timeout=CLIENT_WAIT)  # type: ignore[operator]
    return e.value


# -- a hanging OCI runtime ----------------------------------------------------------


@pytest.fixture
def hang(node: Node, tmp_path: Path) -> Iterator[HangingRuntime]:
    """Runtime handler "hang" on `node`: runc, hanging on the subcommands switched on."""
    with hang_handler(node.proc.config, tmp_path / "hang-runtime", node.tmp / "state",
                      RUNTIME_TIMEOUT) as rt:
        node.restart()
        yield rt


def _hang_pod(node: Node, name: str) -> tuple[str, pb.PodSandboxConfig]:
    cfg = node.pod_config(name)
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=cfg, runtime_handler="hang"), timeout=CLIENT_WAIT
    ).pod_sandbox_id
    return sid, cfg


def _create(node: Node, sid: str, pod: pb.PodSandboxConfig, name: str) -> pb.CreateContainerRequest:
    return pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=pod,
                                     config=node.container_config(name, ["sleep", "1000"]))


def _runtime_ids(node: Node) -> set[str]:
    out = subprocess.run(["runc", "--root", str(node.tmp / "state" / "hang"), "list", "-q"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def _zombies(node: Node, wait: float = 30) -> list[str]:
    """pycri's children that exited and were never reaped (after up to `wait` s)."""
    assert node.proc.proc is not None
    daemon = str(node.proc.proc.pid)
    deadline = time.monotonic() + wait
    while True:
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and fields[1] == daemon:
                found.append(stat.parent.name)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _assert_deadline(err: grpc.RpcError, hang: HangingRuntime, node: Node) -> None:
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.details()
    assert "no answer within" in (err.details() or ""), err.details()
    assert "runtimes.hang.timeout" in (err.details() or "")
    assert hang.hung_pids(), "the runtime never hung: the test proves nothing"
    assert hang.left() == [], "the hung runtime (or its child) was left running or a zombie"
    assert _zombies(node) == [], "pycri left zombies"


def test_hung_runtime_create_is_killed_and_undone(node: Node, hang: HangingRuntime) -> None:
    sid, pod = _hang_pod(node, "hang-create")
    hang.hang("create")
    err = _rpc_error(node.cri.runtime.CreateContainer, _create(node, sid, pod, "c"))
    _assert_deadline(err, hang, node)
    # Nothing of the container is left: no record, bundle, runtime state or monitor.
    assert list(node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers) == []
    assert sorted(p.name for p in (node.tmp / "state" / "bundles").iterdir()) == [sid]
    assert _runtime_ids(node) == {sid}
    # Once the runtime answers again, the same name can be created and run.
    hang.release()
    cid = node.cri.runtime.CreateContainer(_create(node, sid, pod, "c"),
                                           timeout=CLIENT_WAIT).container_id
    node.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=cid),
                                    timeout=CLIENT_WAIT)
    assert node.status(cid).state == pb.CONTAINER_RUNNING


def test_runtime_hung_after_create_is_undone(node: Node, hang: HangingRuntime) -> None:
    """runc has made the container (state, cgroup, `runc init`) and then hangs: the
    deadline removes all of it, not just what pycri made."""
    sid, pod = _hang_pod(node, "hang-after-create")
    hang.hang("create", after=True)
    err = _rpc_error(node.cri.runtime.CreateContainer, _create(node, sid, pod, "c"))
    _assert_deadline(err, hang, node)
    [cid] = hang.done_before_hang()
    assert list(node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers) == []
    assert _runtime_ids(node) == {sid}
    assert list(Path("/sys/fs/cgroup").glob(f"*/pycri/{cid}")) == []
    assert not (node.tmp / "state" / "bundles" / cid).exists()
    # Its `runc init` is reaped too: as a zombie in the pod's PID namespace it kept the
    # infra from exiting, and the pod could not be removed.
    hang.release()
    rt = node.cri.runtime
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=CLIENT_WAIT)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=CLIENT_WAIT)
    assert list(rt.ListPodSandbox(pb.ListPodSandboxRequest()).items) == []


def test_hung_runtime_calls_fail_with_deadline(node: Node, hang: HangingRuntime) -> None:
    """start, kill (StopContainer), update and delete (RemoveContainer) each get the
    deadline, the hung process group is killed, and the call works once retried."""
    sid, pod = _hang_pod(node, "hang-calls")
    rt = node.cri.runtime
    cid = rt.CreateContainer(_create(node, sid, pod, "c"), timeout=CLIENT_WAIT).container_id

    hang.hang("start")
    _assert_deadline(_rpc_error(rt.StartContainer, pb.StartContainerRequest(container_id=cid)),
                     hang, node)
    st = node.status(cid)
    assert st.state == pb.CONTAINER_EXITED and st.reason == "StartError", st
    hang.release()
    rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=CLIENT_WAIT)
    assert _runtime_ids(node) == {sid}

    cid = rt.CreateContainer(_create(node, sid, pod, "c"), timeout=CLIENT_WAIT).container_id
    rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=CLIENT_WAIT)
    hang.hang("update")
    update = pb.UpdateContainerResourcesRequest(
        container_id=cid, linux=pb.LinuxContainerResources(cpu_shares=512))
    _assert_deadline(_rpc_error(rt.UpdateContainerResources, update), hang, node)
    hang.release()
    hang.hang("kill")
    stop = pb.StopContainerRequest(container_id=cid, timeout=1)
    _assert_deadline(_rpc_error(rt.StopContainer, stop), hang, node)
    assert node.status(cid).state == pb.CONTAINER_RUNNING  # nothing was stopped
    hang.release()
    rt.StopContainer(stop, timeout=CLIENT_WAIT)
    assert node.status(cid).state == pb.CONTAINER_EXITED

    hang.hang("delete")
    remove = pb.RemoveContainerRequest(container_id=cid)
    _assert_deadline(_rpc_error(rt.RemoveContainer, remove), hang, node)
    hang.release()
    rt.RemoveContainer(remove, timeout=CLIENT_WAIT)
    assert [c.id for c in rt.ListContainers(pb.ListContainersRequest()).containers] == []
    assert _runtime_ids(node) == {sid}
    assert not os.path.exists(node.tmp / "state" / "bundles" / cid)


def test_runtime_hung_after_start_leaves_no_process_running(node: Node,
                                                            hang: HangingRuntime) -> None:
    """runc started the process and then hung: StartContainer fails and the container is
    reported EXITED, so its process must not run on behind that report."""
    sid, pod = _hang_pod(node, "hang-after-start")
    rt = node.cri.runtime
    cid = rt.CreateContainer(_create(node, sid, pod, "c"), timeout=CLIENT_WAIT).container_id
    _, pid = _pids(node, cid)
    hang.hang("start", after=True)
    _assert_deadline(_rpc_error(rt.StartContainer, pb.StartContainerRequest(container_id=cid)),
                     hang, node)
    st = node.status(cid)
    assert st.state == pb.CONTAINER_EXITED and st.reason == "StartError", st
    assert wait_gone([pid], 30) == [], "the container's process runs on behind EXITED"
    hang.release()
    rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=CLIENT_WAIT)
    assert _runtime_ids(node) == {sid}


def test_runtime_hung_on_state_at_restart_keeps_what_runs(node: Node,
                                                          hang: HangingRuntime) -> None:
    """A restart does not take a runtime that cannot say `state` as "gone": the pod and
    container whose monitors run are still READY and RUNNING."""
    sid, pod = _hang_pod(node, "hang-state")
    rt = node.cri.runtime
    cid = rt.CreateContainer(_create(node, sid, pod, "c"), timeout=CLIENT_WAIT).container_id
    rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=CLIENT_WAIT)
    hang.hang("state")
    node.restart()
    assert node.pod_status(sid).state == pb.SANDBOX_READY
    assert node.status(cid).state == pb.CONTAINER_RUNNING
    assert hang.left() == [] and _zombies(node) == []
    hang.release()
    rt = node.cri.runtime
    rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1), timeout=CLIENT_WAIT)
    assert node.status(cid).state == pb.CONTAINER_EXITED


# -- conmon killed --------------------------------------------------------------------
# (Test names avoid the word "conmon": the leak check pgreps `conmon.*<tmp dir>`.)


def _pids(node: Node, oid: str) -> tuple[int, int]:
    """(conmon pid, container pid) from conmon's pid files."""
    monitor = node.tmp / "state" / "bundles" / oid / "monitor"
    return int((monitor / "conmon.pid").read_text()), int((monitor / "pidfile").read_text())


def _wait_exited(node: Node, cid: str, wait: float = 60) -> pb.ContainerStatus:
    deadline = time.monotonic() + wait
    while (st := node.status(cid)).state != pb.CONTAINER_EXITED:
        assert time.monotonic() < deadline, f"container still {pb.ContainerState.Name(st.state)}"
        time.sleep(0.2)
    return st


def _assert_monitor_died(node: Node, cid: str, pid: int, conmon_pid: int) -> None:
    st = _wait_exited(node, cid)
    assert st.reason == "MonitorDied", st
    assert f"conmon, pid {conmon_pid}" in st.message and "killed" in st.message, st.message
    assert st.exit_code == 137
    assert wait_gone([pid], 30) == [], "container process left running or a zombie"
    rt = node.cri.runtime
    rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1), timeout=CLIENT_WAIT)
    rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=CLIENT_WAIT)
    assert list(rt.ListContainers(pb.ListContainersRequest()).containers) == []


def test_monitor_sigkill_reports_exited_and_kills_container(node: Node) -> None:
    sid, pod = node.run_pod("monitor-killed")
    cid = node.run(sid, pod, "c", ["sleep", "1000"])
    conmon_pid, pid = _pids(node, cid)
    os.kill(conmon_pid, signal.SIGKILL)
    _assert_monitor_died(node, cid, pid, conmon_pid)
    assert node.pod_status(sid).state == pb.SANDBOX_READY  # only the container was hit


def test_monitor_killed_while_pycri_down(node: Node) -> None:
    sid, pod = node.run_pod("monitor-killed-down")
    cid = node.run(sid, pod, "c", ["sleep", "1000"])
    conmon_pid, pid = _pids(node, cid)
    node.cri.channel.close()
    assert node.proc.stop() == 0
    os.kill(conmon_pid, signal.SIGKILL)
    node.start()
    _assert_monitor_died(node, cid, pid, conmon_pid)


def test_infra_monitor_sigkill_makes_pod_notready(node: Node) -> None:
    sid, _ = node.run_pod("infra-monitor-killed")
    conmon_pid, pid = _pids(node, sid)
    os.kill(conmon_pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while node.pod_status(sid).state != pb.SANDBOX_NOTREADY:
        assert time.monotonic() < deadline, "pod still READY with its infra's monitor dead"
        time.sleep(0.2)
    assert wait_gone([pid], 30) == [], "infra process left running or a zombie"


# -- a hanging CNI plugin ---------------------------------------------------------------

PLUGIN_TIMEOUT = 3


def _hung_plugin_node(node: Node, hang_on: str) -> tuple[Path, Path]:
    """Chain plugin "hangplug" (hanging on `hang_on`) with a short cni.plugin_timeout;
    returns (plugin path, file of the pids that hung)."""
    pids = node.tmp / "plugin-hung"
    cfg = node.proc.config
    cfg.write_text(cfg.read_text().replace(
        "[cni]\n", f"[cni]\nplugin_timeout = {PLUGIN_TIMEOUT}\n"))
    return chain_test_plugin(node, "hangplug", hanging_plugin(hang_on, pids)), pids


def _hung(pids: Path) -> list[int]:
    return [int(p) for p in pids.read_text().split()] if pids.exists() else []


def _assert_plugin_killed(err: grpc.RpcError, pids: Path) -> None:
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err.details()
    details = err.details() or ""
    assert "'hangplug'" in details and "no answer within" in details, details
    assert "cni.plugin_timeout" in details, details
    assert _hung(pids), "the plugin never hung: the test proves nothing"
    assert wait_gone(_hung(pids), 30) == [], "hung plugin left running or a zombie"


def test_hung_cni_plugin_add_is_killed_and_undone(node: Node) -> None:
    plugin, pids = _hung_plugin_node(node, "ADD")
    rt = node.cri.runtime
    err = _rpc_error(rt.RunPodSandbox, pb.RunPodSandboxRequest(config=node.pod_config("cni")))
    _assert_plugin_killed(err, pids)
    # The undo ran: earlier plugins DEL'd (no lease, no NAT rule), no netns, no pod.
    assert list(rt.ListPodSandbox(pb.ListPodSandboxRequest()).items) == []
    assert host_local_leases(node) == []
    assert [r for r in nat_rules_with(f"e2e-{node.bridge}")] == []
    assert list((node.tmp / "root" / "sandboxes").glob("*")) == []
    assert list((node.tmp / "root" / "cni-cache").rglob("*.json")) == []
    assert not [n for n in os.listdir("/run/netns") if n.startswith("pycri-")
                and n.removeprefix("pycri-") in node.proc.log_text()]
    # Once the plugin answers, the same pod runs.
    plugin.write_text(hanging_plugin("NEVER", pids))
    sid, _ = node.run_pod("cni")
    assert node.pod_status(sid).state == pb.SANDBOX_READY


def test_hung_cni_plugin_del_fails_stop_which_can_be_retried(node: Node) -> None:
    plugin, pids = _hung_plugin_node(node, "DEL")
    rt = node.cri.runtime
    sid, _ = node.run_pod("cni-del")
    err = _rpc_error(rt.StopPodSandbox, pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    _assert_plugin_killed(err, pids)
    assert host_local_leases(node) == []  # bridge's DEL ran although hangplug's hung
    plugin.write_text(hanging_plugin("NEVER", pids))
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=CLIENT_WAIT)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=CLIENT_WAIT)
    assert list((node.tmp / "root" / "cni-cache").rglob("*.json")) == []


# -- the registry dying mid-pull ----------------------------------------------------------


def _image_files(node: Node) -> set[str]:
    root = node.tmp / "root"
    return {str(p.relative_to(root)) for d in ("content", "layers", "tmp", "snapshots")
            for p in (root / d).rglob("*") if p.is_file()}


@pytest.mark.parametrize("cut_after", [300, 1 << 20], ids=["in-headers", "mid-blob"])
def test_registry_dying_mid_pull_leaves_nothing(node: Node, registry: Registry,
                                                 cut_after: int) -> None:
    big = [images.file("big", os.urandom(4 << 20))]  # incompressible: 4 MiB on the wire
    spec = images.ImageSpec(layers=[*images.busybox_layers(), big])
    ref = images.push_image(registry.addr, node.tmp / "layout-big", "midpull", "v1", [spec])
    proxy = DroppingProxy(registry.addr, limit=cut_after)
    try:
        via = ref.replace(registry.addr, proxy.addr)
        before = _image_files(node)
        err = _rpc_error(node.cri.image.PullImage,
                         pb.PullImageRequest(image=pb.ImageSpec(image=via)))
        assert proxy.dropped, "the proxy never cut a connection: the test proves nothing"
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err.details()
        assert proxy.addr in (err.details() or ""), err.details()
        assert _image_files(node) == before  # nothing half-written in content/ or layers/
        listed = node.cri.image.ListImages(pb.ListImagesRequest()).images
        assert not [i for i in listed if any("midpull" in t for t in i.repo_tags)]
        # The registry is back: the next pull completes and the image runs.
        proxy.limit = None
        node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=via)),
                                 timeout=CLIENT_WAIT)
        st = node.cri.image.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=via)))
        assert st.image.id and st.image.size >= 4 << 20
    finally:
        proxy.close()


# -- the metadata database left mid-transaction ---------------------------------------------

_WRITER = r"""
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=float(sys.argv[2]), isolation_level=None)
try:
    db.execute("BEGIN IMMEDIATE")
except sqlite3.OperationalError as e:
    print("locked:", e, flush=True)
    sys.exit(3)
db.execute("DELETE FROM records WHERE kind = 'container'")
junk = json.dumps({"junk": "x" * 65536})
for i in range(400):  # ~26 MB: more than the page cache, so it spills into the WAL
    db.execute("INSERT INTO records VALUES ('sandbox', ?, ?)", (f"bogus{i}", junk))
print("in transaction", flush=True)
sys.stdin.read()  # killed here, the transaction still open
"""


def test_db_left_mid_transaction_recovers(node: Node) -> None:
    rt = node.cri.runtime
    sid, pod = node.run_pod("db")
    cid = node.run(sid, pod, "c", ["sleep", "1000"])
    db = str(node.tmp / "root" / "pycri.db")
    # While pycri runs, no other writer gets in (so none can stall or fail its writes).
    other = subprocess.run([sys.executable, "-c", _WRITER, db, "0.5"], capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert other.returncode == 3 and "locked" in other.stdout, (other.stdout, other.stderr)
    sid2, _ = node.run_pod("db-2")
    # pycri dies by SIGKILL; then a writer dies by SIGKILL inside its transaction.
    node.cri.channel.close()
    node.proc.kill()
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, db, "10"], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().startswith("in transaction")
        assert os.path.getsize(db + "-wal") > 1 << 20  # the open transaction reached the WAL
    finally:
        writer.kill()
        writer.wait()
    node.start()
    rt = node.cri.runtime
    # Everything the client was told exists is there, and nothing of the dead writer.
    assert {p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest()).items} == {sid, sid2}
    assert [c.id for c in rt.ListContainers(pb.ListContainersRequest()).containers] == [cid]
    assert node.status(cid).state == pb.CONTAINER_RUNNING
    sid3, _ = node.run_pod("db-3")  # and pycri writes on
    assert node.pod_status(sid3).state == pb.SANDBOX_READY


def test_runtime_hung_in_exec_sync_is_killed_with_its_children(
    node: Node, hang: HangingRuntime
) -> None:
    """A runtime hung in `exec` (under ExecSync's conmon) is killed with its whole group
    when the call gives up, and pycri reaps what that leaves it."""
    sid, pod = _hang_pod(node, "hang-exec")
    rt = node.cri.runtime
    cid = rt.CreateContainer(_create(node, sid, pod, "c"), timeout=CLIENT_WAIT).container_id
    rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=CLIENT_WAIT)
    hang.hang("exec")
    with pytest.raises(grpc.RpcError) as e:
        rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=["true"], timeout=2),
                    timeout=CLIENT_WAIT)
    assert e.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN), \
        e.value.details()
    assert hang.hung_pids(), "the runtime never hung: the test proves nothing"
    assert hang.left() == [], "the hung runtime (or its child) was left running or a zombie"
    assert _zombies(node) == [], "pycri left zombies"
    hang.release()
    assert rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=["true"]),
                       timeout=CLIENT_WAIT).exit_code == 0
