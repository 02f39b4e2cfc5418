"""Serve first, recheck after (issue 16): a kill -9 restart of a node with 100 running
containers answers from the records while the recheck is still held up, and the
recheck learns every state from the facts on disk, asking the OCI runtime only where
they say nothing.

The OCI runtime here is runc behind a wrapper whose `state` calls block while a file
exists (and are logged), so the test sees what is answered before the recheck is done.
The timings (100 to 1000 pods, against containerd) are hack/bench-restart.py's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import prctl
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e

PODS, PER_POD = 10, 10  # 100 running containers, but only 10 pods to set up
SLEEP = ["sleep", "100000"]
WAIT = 60.0


@pytest.fixture
def subreaper() -> Iterator[None]:
    """Make the test a child subreaper, as init is on a real host (here pid 1 reaps
    nothing): what the killed daemon leaves is re-parented to the test, which can reap
    a killed container init so that its pid is free to be reused. Afterwards the
    zombies re-parented to the test are reaped."""
    prctl.set_child_subreaper(1)
    try:
        yield
    finally:
        prctl.set_child_subreaper(0)
        for pid in _zombie_children():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _zombie_children() -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            out.append(int(d.name))
    return out


def _wrapper(tmp: Path) -> str:
    """runc, except: `state` is logged and blocks while tmp/hold exists; `start` with
    tmp/slow-start present does its work, says so (tmp/started), then takes 30 s."""
    return f"""#!/bin/sh
case " $* " in
  *" state "*)
    echo "$*" >> {tmp}/state-calls
    while [ -e {tmp}/hold ]; do sleep 0.05; done ;;
  *" start "*)
    if [ -e {tmp}/slow-start ]; then
      /usr/sbin/runc "$@"; rc=$?; touch {tmp}/started; sleep 30; exit $rc
    fi ;;
esac
exec /usr/sbin/runc "$@"
"""


def _pids(node: Node, oid: str) -> tuple[int, int]:
    """(conmon pid, container pid) from conmon's pid files."""
    monitor = node.tmp / "state" / "bundles" / oid / "monitor"
    return int((monitor / "conmon.pid").read_text()), int((monitor / "pidfile").read_text())


def _state_calls(node: Node) -> list[str]:
    """The IDs the runtime was asked `state` about, in order."""
    log = node.tmp / "state-calls"
    return [line.split()[-1] for line in log.read_text().splitlines()] if log.exists() else []


def _until(what: str, check: Callable[[], object]) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _reuse_pid(pid: int) -> subprocess.Popen[bytes]:
    """An unrelated process (a sleep) that gets `pid`: the kernel's next pid is set
    through /proc/sys/kernel/ns_last_pid, retried while other processes take it."""
    for _ in range(500):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = subprocess.Popen(["sleep", "1000"])
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    raise AssertionError(f"pid {pid} could not be reused")


def test_kill9_restart_of_100_containers_answers_from_records_while_state_is_held(
    subreaper: None, node: Node
) -> None:
    node.add_runtime("held", _wrapper(node.tmp))
    pods = []
    for i in range(PODS):
        cfg = node.pod_config(f"scale{i}")
        sid = node.cri.runtime.RunPodSandbox(
            pb.RunPodSandboxRequest(config=cfg, runtime_handler="held")).pod_sandbox_id
        pods.append((sid, cfg))
    with ThreadPoolExecutor(4) as pool:
        running = list(pool.map(lambda k: node.run(*pods[k // PER_POD], f"c{k}", SLEEP),
                                range(PODS * PER_POD)))
    sid, pod = pods[0]
    created = node.create(sid, pod, "created", SLEEP)  # never started
    quitter = node.run(sid, pod, "quitter", ["sh", "-c", 'trap "exit 7" TERM; sleep 100000 '
                                                         "& wait"])
    victim = node.run(sid, pod, "victim", SLEEP)  # its pid will name another process
    cut = node.create(sid, pod, "cut", SLEEP)  # pycri is killed inside its start

    # kill -9 pycri once the runtime has started `cut`, before pycri recorded it.
    (node.tmp / "slow-start").touch()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(node.cri.runtime.StartContainer,
                              pb.StartContainerRequest(container_id=cut))
        _until("the runtime never started the container", (node.tmp / "started").exists)
        node.proc.kill()
        with pytest.raises(grpc.RpcError):
            pending.result(timeout=WAIT)
    node.cri.channel.close()
    (node.tmp / "slow-start").unlink()

    # While pycri is down: `quitter` exits 7 (its conmon writes the exit file); the
    # conmon of `victim` is SIGKILLed, then its process, and the pid goes to a sleep.
    sh = _pids(node, quitter)[1]
    os.kill(sh, signal.SIGTERM)
    _until("quitter did not exit", (node.tmp / "state" / "exits" / quitter).exists)
    victim_conmon, victim_pid = _pids(node, victim)
    os.kill(victim_conmon, signal.SIGKILL)
    os.waitpid(victim_conmon, 0)  # re-parented to the test with the daemon's death
    os.kill(victim_pid, signal.SIGKILL)
    os.waitpid(victim_pid, 0)  # re-parented to the test with its conmon's death
    impostor = _reuse_pid(victim_pid)
    try:
        (node.tmp / "hold").touch()
        node.proc.socket.unlink()
        node.start(rechecked=False)

        # The recheck is held up on `state`: everything is answered from the records
        # and from the facts on disk.
        _until("the recheck never asked the runtime", lambda: _state_calls(node))
        rt = node.cri.runtime
        assert rt.Version(pb.VersionRequest()).runtime_name == "pycri"
        assert node.recovery()["pending"] > 0
        listed = {c.id: c.state for c in rt.ListContainers(pb.ListContainersRequest())
                  .containers}
        assert set(listed) == {*running, created, quitter, victim, cut}
        assert all(listed[c] == pb.CONTAINER_RUNNING for c in running)
        assert all(node.status(c).state == pb.CONTAINER_RUNNING for c in running)
        assert [node.pod_status(s).state for s, _ in pods] == [pb.SANDBOX_READY] * PODS
        assert node.status(created).state == pb.CONTAINER_CREATED
        assert node.status(cut).state == pb.CONTAINER_CREATED  # its record, for now
        st = node.status(quitter)
        assert (st.state, st.exit_code, st.reason) == (pb.CONTAINER_EXITED, 7, "Error")
        # The victim's pid runs, but it is not the victim: its monitor's loss is recorded.
        _until("the victim is still reported running",
               lambda: node.status(victim).state == pb.CONTAINER_EXITED)
        st = node.status(victim)
        assert st.reason == "MonitorDied" and "had exited too" in st.message, st
        assert impostor.poll() is None, "pycri killed the process that reused the pid"
        # Only the two CREATED records needed the runtime: no process per container.
        time.sleep(1)
        assert set(_state_calls(node)) <= {created, cut}, _state_calls(node)

        # Released: every state is right.
        (node.tmp / "hold").unlink()
        _until("the recheck never finished", lambda: node.recovery()["pending"] == 0)
        assert node.recovery()["doneAt"] > 0
        assert node.status(cut).state == pb.CONTAINER_RUNNING
        assert node.exec(cut, "echo", "started").stdout == b"started\n"
        assert node.status(created).state == pb.CONTAINER_CREATED
        assert all(node.status(c).state == pb.CONTAINER_RUNNING for c in running)
        assert node.exec(running[-1], "echo", "alive").stdout == b"alive\n"
        assert impostor.poll() is None
    finally:
        impostor.kill()
        impostor.wait()
        (node.tmp / "hold").unlink(missing_ok=True)


def test_restart_asks_the_runtime_nothing_about_what_runs(node: Node) -> None:
    """Pods and containers whose processes run (pid and start time recorded) are
    rechecked without a single runtime call, after SIGTERM as after kill -9."""
    node.add_runtime("held", _wrapper(node.tmp))
    cfg = node.pod_config("quiet")
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=cfg, runtime_handler="held")).pod_sandbox_id
    cids = [node.run(sid, cfg, f"c{i}", SLEEP) for i in range(3)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        (node.tmp / "state-calls").unlink(missing_ok=True)
        if sig == signal.SIGKILL:
            node.proc.kill()
            node.proc.socket.unlink()
            node.start()
        else:
            node.restart(sig)
        _until("the recheck never finished", lambda: node.recovery()["pending"] == 0)
        assert _state_calls(node) == []
        assert node.pod_status(sid).state == pb.SANDBOX_READY
        assert [node.status(c).state for c in cids] == [pb.CONTAINER_RUNNING] * 3
