"""ExecSync against a live daemon: output that fits the kubelet's limit, and a client that
gives up taking the command down with it."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc as pb_grpc
from pycri.monitor.execsync import MAX_OUTPUT, MAX_RESPONSE
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e


@pytest.fixture
def kubelet(node: Node) -> Iterator[pb_grpc.RuntimeServiceStub]:
    """A client that, like the kubelet, accepts messages of 16 MiB at most."""
    channel = grpc.insecure_channel(
        f"unix://{node.proc.socket}", options=[("grpc.max_receive_message_length", MAX_RESPONSE)]
    )
    try:
        yield pb_grpc.RuntimeServiceStub(channel)
    finally:
        channel.close()


def _pids_with_cmdline(*needles: bytes) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{d}/cmdline").read_bytes()
                if all(n in cmd for n in needles):
                    out.append(int(d))
    return out


def _wait_gone(*needles: bytes, timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _pids_with_cmdline(*needles)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_full_stdout_and_stderr_fit_one_response_with_the_exit_code(
    node: Node, kubelet: pb_grpc.RuntimeServiceStub
) -> None:
    sid, cfg = node.run_pod("big-exec")
    cid = node.run(sid, cfg, "c", ["sleep", "1000"])
    script = ("yes 0123456789 | head -c 20000000; yes abcdefghi | head -c 20000000 >&2; "
              "exit 7")
    r = kubelet.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=["sh", "-c", script],
                                            timeout=120), timeout=180)
    assert r.exit_code == 7
    assert r.ByteSize() <= MAX_RESPONSE
    assert len(r.stdout) + len(r.stderr) == MAX_OUTPUT
    assert len(r.stdout) == MAX_OUTPUT // 2
    assert r.stdout == (b"0123456789\n" * (MAX_OUTPUT // 20 + 1))[: len(r.stdout)]
    assert r.stderr == (b"abcdefghi\n" * (MAX_OUTPUT // 20 + 1))[: len(r.stderr)]


def test_exec_sync_the_client_gave_up_on_is_killed(node: Node) -> None:
    """timeout=0 (none) and a 1 s client deadline: the command and its conmon go."""
    sid, cfg = node.run_pod("abandoned-exec")
    cid = node.run(sid, cfg, "c", ["sleep", "1000"])
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.ExecSync(
            pb.ExecSyncRequest(container_id=cid, cmd=["sleep", "4321"], timeout=0), timeout=1
        )
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert _wait_gone(b"sleep\x004321") == []
    assert _wait_gone(b"conmon", b"--exec", cid.encode()) == []
    assert node.status(cid).state == pb.CONTAINER_RUNNING
    assert node.exec(cid, "echo", "still").stdout == b"still\n"
