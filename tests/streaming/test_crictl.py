"""The real crictl (client-go's executors and port-forwarders, over SPDY and over
WebSocket: `--transport websocket` is exec/attach on v5.channel.k8s.io and port-forward
as SPDY tunnelled in WebSocket messages) against a pycri node."""

from __future__ import annotations

import os
import pty
import select
import socket
import subprocess
import time

import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.lib import tools

CAPABILITY = "exec, attach and port-forward through crictl"
pytestmark = [pytest.mark.e2e, tools.needs("crictl", CAPABILITY)]
TRANSPORTS = pytest.mark.parametrize("transport", ["spdy", "websocket"])


def crictl(node: Node, *args: str, **kw: object) -> list[str]:
    path = tools.require("crictl", CAPABILITY)
    return [path, "--runtime-endpoint", f"unix://{node.proc.socket}", *args]


@TRANSPORTS
def test_crictl_exec(node: Node, transport: str) -> None:
    sid, cfg = node.run_pod(f"cexec-{transport}")
    cid = node.run(sid, cfg, "box", ["sleep", "1000"])
    t = ["--transport", transport]
    cmd = ["sh", "-c", "echo hi; echo err >&2; exit 4"]
    done = subprocess.run(crictl(node, "exec", *t, cid, *cmd), capture_output=True, text=True,
                          timeout=30)  # fmt: skip
    assert done.stdout == "hi\n" and "err\n" in done.stderr
    # crictl exits 1 and names the command's exit code (client-go decoded our Status).
    assert done.returncode == 1 and "command terminated with exit code 4" in done.stderr

    # -it through a terminal we allocate: what we type is echoed back by the shell.
    argv = crictl(node, "exec", *t, "-it", cid, "sh")
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - child
        os.execv(argv[0], argv)
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

    # -i without a terminal: the end of our input closes the command's stdin (v5's
    # close signal over WebSocket, the stream's FIN over SPDY), so cat ends.
    done = subprocess.run(crictl(node, "exec", *t, "-i", cid, "cat"), input="piped\n",
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "piped\n"), done


@TRANSPORTS
def test_crictl_attach_and_port_forward(node: Node, transport: str) -> None:
    sid, cfg = node.run_pod(f"cattach-{transport}")
    cid = node.run(sid, cfg, "shell", ["sh"], stdin=True, stdin_once=True)
    t = ["--transport", transport]
    done = subprocess.run(crictl(node, "attach", *t, "-i", cid), input="echo attached\n",
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert "attached\n" in done.stdout, done

    web = ["sh", "-c", "mkdir -p /tmp/w && echo crictl-pf > /tmp/w/index.html && "
           "exec httpd -f -p 8080 -h /tmp/w"]  # fmt: skip
    node.run(sid, cfg, "web", web)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        local = s.getsockname()[1]
    fwd = subprocess.Popen(crictl(node, "port-forward", *t, sid, f"{local}:8080"),
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
