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
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.lib.faults import HangingRuntime

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
    rt = HangingRuntime(tmp_path / "hang-runtime")
    cfg = node.proc.config
    cfg.write_text(cfg.read_text()
                   + f'[runtimes.hang]\npath = "{rt.path}"\ntimeout = {RUNTIME_TIMEOUT}\n')
    node.restart()
    try:
        yield rt
    finally:
        rt.release()
        rt.kill_all()
        root = node.tmp / "state" / "hang"
        for d in root.glob("*") if root.exists() else []:
            subprocess.run(["runc", "--root", str(root), "delete", "--force", d.name],
                           capture_output=True)


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


def _assert_deadline(err: grpc.RpcError, hang: HangingRuntime) -> None:
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.details()
    assert "no answer within" in (err.details() or ""), err.details()
    assert "runtimes.hang.timeout" in (err.details() or "")
    assert hang.hung_pids(), "the runtime never hung: the test proves nothing"
    assert hang.alive() == [], "the hung runtime (or its child) was left running"


def test_hung_runtime_create_is_killed_and_undone(node: Node, hang: HangingRuntime) -> None:
    sid, pod = _hang_pod(node, "hang-create")
    hang.hang("create")
    err = _rpc_error(node.cri.runtime.CreateContainer, _create(node, sid, pod, "c"))
    _assert_deadline(err, hang)
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


def test_hung_runtime_calls_fail_with_deadline(node: Node, hang: HangingRuntime) -> None:
    """start, kill (StopContainer), update and delete (RemoveContainer) each get the
    deadline, the hung process group is killed, and the call works once retried."""
    sid, pod = _hang_pod(node, "hang-calls")
    rt = node.cri.runtime
    cid = rt.CreateContainer(_create(node, sid, pod, "c"), timeout=CLIENT_WAIT).container_id

    hang.hang("start")
    _assert_deadline(_rpc_error(rt.StartContainer, pb.StartContainerRequest(container_id=cid)),
                     hang)
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
    _assert_deadline(_rpc_error(rt.UpdateContainerResources, update), hang)
    hang.release()
    hang.hang("kill")
    stop = pb.StopContainerRequest(container_id=cid, timeout=1)
    _assert_deadline(_rpc_error(rt.StopContainer, stop), hang)
    assert node.status(cid).state == pb.CONTAINER_RUNNING  # nothing was stopped
    hang.release()
    rt.StopContainer(stop, timeout=CLIENT_WAIT)
    assert node.status(cid).state == pb.CONTAINER_EXITED

    hang.hang("delete")
    remove = pb.RemoveContainerRequest(container_id=cid)
    _assert_deadline(_rpc_error(rt.RemoveContainer, remove), hang)
    hang.release()
    rt.RemoveContainer(remove, timeout=CLIENT_WAIT)
    assert [c.id for c in rt.ListContainers(pb.ListContainersRequest()).containers] == []
    assert _runtime_ids(node) == {sid}
    assert not os.path.exists(node.tmp / "state" / "bundles" / cid)


# -- conmon killed --------------------------------------------------------------------
# (Test names avoid the word "conmon": the leak check pgreps `conmon.*<tmp dir>`.)


def _pids(node: Node, oid: str) -> tuple[int, int]:
    """(conmon pid, container pid) from conmon's pid files."""
    monitor = node.tmp / "state" / "bundles" / oid / "monitor"
    return int((monitor / "conmon.pid").read_text()), int((monitor / "pidfile").read_text())


def _exists(pid: int) -> bool:
    """Alive or a zombie nobody reaped: both are leaks."""
    return Path(f"/proc/{pid}").exists()


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
    deadline = time.monotonic() + 30
    while _exists(pid):  # killed and reaped, not left running or a zombie
        assert time.monotonic() < deadline, Path(f"/proc/{pid}/status").read_text()
        time.sleep(0.1)
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
    node.proc.start()
    node.cri = node.proc.client()
    _assert_monitor_died(node, cid, pid, conmon_pid)


def test_infra_monitor_sigkill_makes_pod_notready(node: Node) -> None:
    sid, _ = node.run_pod("infra-monitor-killed")
    conmon_pid, pid = _pids(node, sid)
    os.kill(conmon_pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while node.pod_status(sid).state != pb.SANDBOX_NOTREADY:
        assert time.monotonic() < deadline, "pod still READY with its infra's monitor dead"
        time.sleep(0.2)
    while _exists(pid):
        assert time.monotonic() < deadline, "infra process left behind"
        time.sleep(0.1)
