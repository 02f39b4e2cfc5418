"""The real crictl (client-go's SPDY executor and port-forwarder) against a pycri node."""

from __future__ import annotations

import os
import pty
import select
import socket
import subprocess
import time
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

CRICTL = Path("/usr/local/bin/crictl")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not CRICTL.exists(), reason="needs crictl at /usr/local/bin/crictl"),
]


def crictl(node: Node, *args: str, **kw: object) -> list[str]:
    return [str(CRICTL), "--runtime-endpoint", f"unix://{node.proc.socket}", *args]


def test_crictl_exec(node: Node) -> None:
    sid, cfg = node.run_pod("cexec")
    cid = node.run(sid, cfg, "box", ["sleep", "1000"])
    done = subprocess.run(crictl(node, "exec", cid, "sh", "-c", "echo hi; echo err >&2; exit 4"),
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.stdout == "hi\n" and "err\n" in done.stderr
    # crictl exits 1 and names the command's exit code (client-go decoded our Status).
    assert done.returncode == 1 and "command terminated with exit code 4" in done.stderr

    # -it through a terminal we allocate: what we type is echoed back by the shell.
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - child
        os.execv(str(CRICTL), crictl(node, "exec", "-it", cid, "sh"))
    try:
        output = b""
        os.write(master, b"echo $((6*7)); exit 5\n")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                output += chunk
        assert b"42" in output, output
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 1
        assert b"exit code 5" in output, output
    finally:
        os.close(master)


def test_crictl_attach_and_port_forward(node: Node) -> None:
    sid, cfg = node.run_pod("cattach")
    cid = node.run(sid, cfg, "shell", ["sh"], stdin=True, stdin_once=True)
    done = subprocess.run(crictl(node, "attach", "-i", cid), input="echo attached\n",
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert "attached\n" in done.stdout, done

    web = ["sh", "-c", "mkdir -p /tmp/w && echo crictl-pf > /tmp/w/index.html && "
           "exec httpd -f -p 8080 -h /tmp/w"]  # fmt: skip
    node.run(sid, cfg, "web", web)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        local = s.getsockname()[1]
    fwd = subprocess.Popen(crictl(node, "port-forward", sid, f"{local}:8080"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        reply = b""
        deadline = time.monotonic() + 20
        while b"crictl-pf" not in reply and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", local), timeout=5) as c:
                    c.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
                    reply = b"".join(iter(lambda: c.recv(4096), b""))
            except OSError:
                time.sleep(0.2)
        assert b"crictl-pf" in reply, reply
    finally:
        fwd.terminate()
        fwd.wait(10)
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
