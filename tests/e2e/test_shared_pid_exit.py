"""A container in its pod's PID namespace takes its processes with it when it exits, as
one in its own namespace does (where the kernel kills them with its init)."""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e
SHARED = pb.NamespaceOption(pid=pb.POD)


def _shared_pod(node: Node, name: str) -> tuple[str, pb.PodSandboxConfig]:
    return node.run_pod(name, linux=pb.LinuxPodSandboxConfig(
        security_context=pb.LinuxSandboxSecurityContext(namespace_options=SHARED)))


def _run_shared(node: Node, sid: str, pod: pb.PodSandboxConfig, name: str,
                cmd: list[str]) -> str:
    return node.run(sid, pod, name, cmd, linux=pb.LinuxContainerConfig(
        security_context=pb.LinuxContainerSecurityContext(namespace_options=SHARED)))


def _pids(arg: bytes) -> list[int]:
    """Host pids running `sleep <arg>`."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{d}/cmdline").read_bytes() == b"sleep\0" + arg + b"\0":
                    out.append(int(d))
    return out


def _wait(pred: object, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)
    return bool(pred())  # type: ignore[operator]


def test_background_process_dies_with_its_container(node: Node) -> None:
    sid, pod = _shared_pod(node, "leftover")
    cid = _run_shared(node, sid, pod, "c", ["sh", "-c", "sleep 777 & sleep 1; exit 0"])
    assert _wait(lambda: _pids(b"777")), "the background sleep never started"
    assert _wait(lambda: node.status(cid).state == pb.CONTAINER_EXITED)
    assert node.status(cid).exit_code == 0
    assert _wait(lambda: not _pids(b"777")), _pids(b"777")
    # The pod and its other containers are untouched.
    other = _run_shared(node, sid, pod, "other", ["sleep", "1000"])
    assert node.exec(other, "echo", "ok").stdout == b"ok\n"


def test_exec_running_when_its_container_exits_ends_killed(node: Node) -> None:
    """The exec would sleep 600 s; killed with its container it reports SIGKILL (137),
    long before the client's deadline, not 0 at its natural end."""
    sid, pod = _shared_pod(node, "exec-outlives")
    cid = _run_shared(node, sid, pod, "c", ["sleep", "3"])
    with ThreadPoolExecutor(1) as pool:
        f = pool.submit(lambda: node.cri.runtime.ExecSync(
            pb.ExecSyncRequest(container_id=cid, cmd=["sleep", "600"], timeout=0), timeout=120))
        assert _wait(lambda: _pids(b"600")), "the exec never started"
        r = f.result(timeout=180)
    assert r.exit_code == 137
    assert node.status(cid).state == pb.CONTAINER_EXITED
    assert not _pids(b"600")
    with pytest.raises(grpc.RpcError) as e:
        node.exec(cid, "true")
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_exit_missed_while_down_still_kills_the_leftovers(node: Node) -> None:
    sid, pod = _shared_pod(node, "missed")
    cid = _run_shared(node, sid, pod, "c", ["sh", "-c", "sleep 778 & sleep 2"])
    assert _wait(lambda: _pids(b"778")), "the background sleep never started"
    node.cri.channel.close()
    assert node.proc.stop() == 0
    exit_file = node.tmp / "state" / "exits" / cid
    assert _wait(exit_file.exists), "the container did not exit while pycri was down"
    assert _pids(b"778"), "nothing was left over to kill"
    node.start()
    assert node.status(cid).state == pb.CONTAINER_EXITED
    assert _wait(lambda: not _pids(b"778")), _pids(b"778")
