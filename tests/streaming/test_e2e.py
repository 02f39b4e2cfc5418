"""Exec, Attach and PortForward end to end: a real pycri node, runc/crun, conmon, CNI,
driven by the SPDY client in tests/streaming/client.py (no crictl needed)."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.streaming import client

pytestmark = pytest.mark.e2e

SLEEP = ["sleep", "1000"]
WEB = ["sh", "-c", "mkdir -p /tmp/w && echo hi-from-pod > /tmp/w/index.html && "
       "exec httpd -f -p 8080 -h /tmp/w"]  # fmt: skip


def exec_url(node: Node, cid: str, cmd: list[str], **kw: bool) -> str:
    return node.cri.runtime.Exec(pb.ExecRequest(container_id=cid, cmd=cmd, **kw)).url


def code_of(err: grpc.RpcError) -> grpc.StatusCode:
    return err.code()


@pytest.mark.parametrize("handler", ["runc", "crun"])
def test_exec_streams_exit_codes_and_tty(node: Node, handler: str) -> None:
    cfg = node.pod_config(f"exec-{handler}")
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=cfg, runtime_handler=handler)).pod_sandbox_id
    cid = node.run(sid, cfg, "box", SLEEP)

    # stdout and stderr apart, a non-zero exit as NonZeroExitCode with the code.
    url = exec_url(node, cid, ["sh", "-c", "echo out; echo err >&2; exit 3"],
                   stdout=True, stderr=True)
    assert url.startswith("http://127.0.0.1:")
    out = asyncio.run(client.run(url))
    assert (out.stdout, out.stderr, out.protocol) == (b"out\n", b"err\n", "v4.channel.k8s.io")
    status = out.status
    assert status["status"] == "Failure" and status["reason"] == "NonZeroExitCode"
    assert status["details"] == {"causes": [{"reason": "ExitCode", "message": "3"}]}

    # stdin reaches the process and its end closes the process's stdin.
    url = exec_url(node, cid, ["sh", "-c", "tr a-z A-Z; echo done"], stdin=True, stdout=True)
    out = asyncio.run(client.run(url, stdin=b"hello\n", stderr=False))
    assert out.stdout == b"HELLO\ndone\n"
    assert out.status["status"] == "Success"

    # A terminal: resize applied, output through the pty, and the process runs on it.
    url = exec_url(node, cid, ["sh", "-c", "sleep 0.3; stty size; tty"], tty=True,
                   stdin=True, stdout=True)  # fmt: skip
    out = asyncio.run(client.run(url, stdin=b"", tty=True, resize=(123, 45), close_stdin=False))
    text = out.stdout.decode()
    assert "45 123" in text and "/dev/pts/" in text, text
    assert out.status["status"] == "Success"

    # Older protocol versions: a failure is plain text, success writes nothing.
    url = exec_url(node, cid, ["sh", "-c", "exit 7"], stdout=True)
    out = asyncio.run(client.run(url, stderr=False, protocols=("v2.channel.k8s.io",)))
    assert out.protocol == "v2.channel.k8s.io"
    assert out.error == b"command terminated with non-zero exit code: exit status 7"

    # A command that does not exist: the runtime's error comes back as a Failure.
    url = exec_url(node, cid, ["/no/such/binary"], stdout=True)
    out = asyncio.run(client.run(url, stderr=False))
    assert out.status["status"] == "Failure"
    assert "no/such/binary" in str(out.status["message"])


@pytest.mark.parametrize("handler", ["runc", "crun"])
def test_tty_exec_of_an_instant_command_reports_its_exit(node: Node, handler: str) -> None:
    """critest's `exec with tty=true and stdin=true` (`echo hello`): the process exits
    and is reaped while pycri still waits for the terminal from the console socket, so
    its exit status must already be kept then; many rounds, since it is a race."""
    cfg = node.pod_config(f"tty-race-{handler}")
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=cfg, runtime_handler=handler)).pod_sandbox_id
    cid = node.run(sid, cfg, "box", SLEEP)
    got, want, statuses = [], [], []
    for i in range(24):
        code = i % 2 * 5  # a zero and a non-zero exit code, each reported right
        cmd = ["sh", "-c", f"echo hello; exit {code}"] if code else ["echo", "hello"]
        url = exec_url(node, cid, cmd, tty=True, stdin=True, stdout=True)
        out = asyncio.run(client.run(url, stdin=b"", tty=True, close_stdin=False))
        statuses.append(out.status)
        got.append((out.stdout.strip(), out.status["status"], out.status.get("details")))
        want.append((b"hello", "Failure", {"causes": [{"reason": "ExitCode", "message": "5"}]})
                    if code else (b"hello", "Success", None))  # fmt: skip
    assert got == want, statuses


# runc, but an exec's pid file then names a process already reaped: its status is lost.
LOST_PID = """#!/bin/sh
/usr/sbin/runc "$@" || exit
case " $* " in *" exec "*) ;; *) exit 0;; esac
prev=
for arg; do [ "$prev" = --pid-file ] && pidfile=$arg; prev=$arg; done
true & wait $!
echo $! > "$pidfile"
"""


def test_exec_whose_exit_status_is_lost_still_ends(node: Node) -> None:
    """When the exec'd process's wait status cannot be had, the stream still ends, with
    exit code 255 (asyncio's for a lost status), not an internal error."""
    node.add_runtime("lostpid", LOST_PID)
    cfg = node.pod_config("lost-status")
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=cfg, runtime_handler="lostpid")).pod_sandbox_id
    cid = node.run(sid, cfg, "box", SLEEP)
    for tty in (True, False):
        url = exec_url(node, cid, ["echo", "hello"], tty=tty, stdout=True)
        out = asyncio.run(client.run(url, tty=tty, stderr=False))
        assert out.status["status"] == "Failure", out.status
        assert out.status["details"] == {"causes": [{"reason": "ExitCode", "message": "255"}]}
        assert out.stdout.strip() == b"hello"


def test_exec_and_attach_validation(node: Node) -> None:
    sid, cfg = node.run_pod("valid")
    cid = node.run(sid, cfg, "box", SLEEP)
    rt = node.cri.runtime
    cases = [
        (pb.ExecRequest(container_id="nosuch", cmd=["true"], stdout=True),
         grpc.StatusCode.NOT_FOUND),
        (pb.ExecRequest(container_id=cid, cmd=["true"]), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.ExecRequest(container_id=cid, cmd=[], stdout=True), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.ExecRequest(container_id=cid, cmd=["true"], tty=True, stdout=True, stderr=True),
         grpc.StatusCode.INVALID_ARGUMENT),
    ]  # fmt: skip
    for req, code in cases:
        with pytest.raises(grpc.RpcError) as e:
            rt.Exec(req)
        assert code_of(e.value) == code, req
    with pytest.raises(grpc.RpcError) as e:
        rt.PortForward(pb.PortForwardRequest(pod_sandbox_id="nosuch"))
    assert code_of(e.value) == grpc.StatusCode.NOT_FOUND

    # A URL works once.
    url = exec_url(node, cid, ["true"], stdout=True)
    assert asyncio.run(client.run(url, stderr=False)).status["status"] == "Success"
    with pytest.raises(ConnectionRefusedError, match="404"):
        asyncio.run(client.run(url, stderr=False))
    # A plain GET (no upgrade) is refused without using anything up.
    with pytest.raises(urllib.error.HTTPError) as http_err:
        urllib.request.urlopen(exec_url(node, cid, ["true"], stdout=True), timeout=5)
    assert http_err.value.code == 400
    # No common protocol version: 403, and the versions we speak are listed.
    with pytest.raises(ConnectionRefusedError, match="403"):
        asyncio.run(client.run(exec_url(node, cid, ["true"], stdout=True), stderr=False,
                               protocols=("v9.channel.k8s.io",)))  # fmt: skip

    # Exited container: FailedPrecondition for both.
    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0))
    for call in (lambda: rt.Exec(pb.ExecRequest(container_id=cid, cmd=["true"], stdout=True)),
                 lambda: rt.Attach(pb.AttachRequest(container_id=cid, stdout=True))):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert code_of(e.value) == grpc.StatusCode.FAILED_PRECONDITION


def test_attach_stdin_once(node: Node) -> None:
    sid, cfg = node.run_pod("attach")
    cid = node.run(sid, cfg, "shell", ["sh"], stdin=True, stdin_once=True)
    url = node.cri.runtime.Attach(
        pb.AttachRequest(container_id=cid, stdin=True, stdout=True, stderr=True)).url
    out = asyncio.run(client.run(url, stdin=b"echo hello; echo oops >&2\n"))
    assert (out.stdout, out.stderr) == (b"hello\n", b"oops\n")
    assert out.status["status"] == "Success"
    # stdin_once: the end of our input closed the shell's stdin, so it exited.
    deadline = time.monotonic() + 10
    while node.status(cid).state != pb.CONTAINER_EXITED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node.status(cid).state == pb.CONTAINER_EXITED


def test_attach_tty_resizes(node: Node) -> None:
    sid, cfg = node.run_pod("attach-tty")
    cid = node.run(sid, cfg, "shell", ["sh"], stdin=True, tty=True)
    url = node.cri.runtime.Attach(
        pb.AttachRequest(container_id=cid, stdin=True, stdout=True, tty=True)).url
    # The input stays open (the container keeps its stdin); the shell's exit ends it all.
    out = asyncio.run(client.run(url, stdin=b"sleep 0.3; stty size; exit\n", tty=True,
                                 resize=(77, 22), close_stdin=False, timeout=15))  # fmt: skip
    assert b"22 77" in out.stdout, out.stdout
    assert out.status["status"] == "Success"


@pytest.mark.parametrize("host_network", [False, True])
def test_port_forward(node: Node, host_network: bool) -> None:
    kw: dict[str, object] = {}
    port = 8080
    cmd = WEB
    if host_network:
        port = 20000 + int(time.time() * 1000) % 20000
        cmd = [WEB[0], WEB[1], WEB[2].replace("8080", str(port))]
        kw["linux"] = pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(network=pb.NODE)))
    sid, cfg = node.run_pod(f"pf-{int(host_network)}", **kw)
    node.run(sid, cfg, "web", cmd)
    url = node.cri.runtime.PortForward(pb.PortForwardRequest(pod_sandbox_id=sid)).url
    request = b"GET /index.html HTTP/1.0\r\n\r\n"
    deadline = time.monotonic() + 10
    while True:
        reply, error = asyncio.run(client.forward_once(url, port, request))
        if reply or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # httpd not listening yet
        url = node.cri.runtime.PortForward(pb.PortForwardRequest(pod_sandbox_id=sid)).url
    assert reply.startswith(b"HTTP/1.") and b"hi-from-pod" in reply, (reply, error)
    assert error == b""

    # Nothing listening: the reason comes back on the error stream.
    url = node.cri.runtime.PortForward(pb.PortForwardRequest(pod_sandbox_id=sid)).url
    reply, error = asyncio.run(client.forward_once(url, 1, b"x"))
    assert reply == b"" and b"refused" in error.lower(), error
