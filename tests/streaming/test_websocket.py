"""Exec, Attach and PortForward over WebSocket against a real pycri node (runc, conmon,
CNI), driven by the wsproto client in tests/streaming/wsclient.py."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from urllib.parse import urlsplit

import pytest

from pycri.api import api_pb2 as pb
from pycri.streaming.limits import MAX_FRAME
from tests.e2e.conftest import Node
from tests.streaming import wsclient
from tests.streaming.wsclient import ERROR, STDOUT

pytestmark = pytest.mark.e2e

SLEEP = ["sleep", "1000"]


def exec_url(node: Node, cid: str, cmd: list[str], **kw: bool) -> str:
    return node.cri.runtime.Exec(pb.ExecRequest(container_id=cid, cmd=cmd, **kw)).url


def test_exec_over_websocket(node: Node) -> None:
    sid, cfg = node.run_pod("ws-exec")
    cid = node.run(sid, cfg, "box", SLEEP)

    # v5: stdout and stderr apart, the exit code in the same Status as on SPDY, a normal
    # closure, and kubelet's empty "ready" message first, on stdout.
    url = exec_url(node, cid, ["sh", "-c", "echo out; echo err >&2; exit 3"],
                   stdout=True, stderr=True)  # fmt: skip
    out = wsclient.run(url)
    assert (out.stdout, out.stderr, out.protocol) == (b"out\n", b"err\n", "v5.channel.k8s.io")
    assert out.first == STDOUT and out.closed.code == 1000
    assert out.status == {
        "metadata": {}, "status": "Failure",
        "message": "command terminated with non-zero exit code: exit status 3",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }  # fmt: skip

    # v5's close signal ends stdin: cat sees EOF and the command ends.
    url = exec_url(node, cid, ["cat"], stdin=True, stdout=True)
    out = wsclient.run(url, stdin=b"hello over websocket\n", timeout=15)
    assert out.stdout == b"hello over websocket\n"
    assert out.status == {"metadata": {}, "status": "Success"}

    # The base64 variant: text messages, same outcome.
    url = exec_url(node, cid, ["sh", "-c", "tr a-z A-Z"], stdin=True, stdout=True)
    out = wsclient.run(url, protocols=("v5.base64.channel.k8s.io",), stdin=b"abc\n")
    assert (out.protocol, out.stdout) == ("v5.base64.channel.k8s.io", b"ABC\n")

    # v4 (no close signal): the same JSON status; client preference order wins.
    url = exec_url(node, cid, ["sh", "-c", "echo four; exit 9"], stdout=True)
    out = wsclient.run(url, protocols=("v4.channel.k8s.io", "v5.channel.k8s.io"))
    assert (out.protocol, out.stdout) == ("v4.channel.k8s.io", b"four\n")
    assert out.status["details"] == {"causes": [{"reason": "ExitCode", "message": "9"}]}

    # channel.k8s.io (v1 rules): a failure is plain text, success writes nothing.
    url = exec_url(node, cid, ["sh", "-c", "exit 7"], stdout=True)
    out = wsclient.run(url, protocols=("channel.k8s.io",))
    assert out.error == b"command terminated with non-zero exit code: exit status 7"
    url = exec_url(node, cid, ["true"], stdout=True)
    assert wsclient.run(url, protocols=()).error == b""  # none offered: v1 rules too

    # A terminal: the resize reaches the pty, the process runs on it.
    url = exec_url(node, cid, ["sh", "-c", "sleep 0.3; stty size; tty"], tty=True,
                   stdin=True, stdout=True)  # fmt: skip
    out = wsclient.run(url, stdin=b"", close_stdin=False, resize=(123, 45))
    text = out.stdout.decode()
    assert "45 123" in text and "/dev/pts/" in text, text
    assert out.status["status"] == "Success"

    # A command that cannot start: the runtime's reason as a Failure.
    out = wsclient.run(exec_url(node, cid, ["/no/such/binary"], stdout=True))
    assert out.status["status"] == "Failure" and "no/such/binary" in str(out.status["message"])


def test_websocket_refusals_and_bounds(node: Node) -> None:
    sid, cfg = node.run_pod("ws-bounds")
    cid = node.run(sid, cfg, "box", SLEEP)

    # A token works once, over either transport; an unknown one is refused.
    url = exec_url(node, cid, ["true"], stdout=True)
    assert wsclient.run(url).status["status"] == "Success"
    for bad in (url, url.rsplit("/", 1)[0] + "/not-a-token"):
        with pytest.raises(wsclient.Refused) as e:
            wsclient.connect(bad, ["v5.channel.k8s.io"])
        assert e.value.status == 404
    # A handshake wsproto rejects (no key): 400 with its reason.
    parts = urlsplit(exec_url(node, cid, ["true"], stdout=True))
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: "
                     "Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\r\n"
                     .encode())  # fmt: skip
        reply = b"".join(iter(lambda: sock.recv(4096), b""))
    assert reply.startswith(b"HTTP/1.1 400") and b"Sec-WebSocket-Key" in reply, reply
    # No common sub-protocol: 403 naming ours, and nothing ran.
    with pytest.raises(wsclient.Refused, match=r"403.*v5\.channel\.k8s\.io"):
        wsclient.connect(exec_url(node, cid, ["true"], stdout=True), ["v9.channel.k8s.io"])
    # Port-forward sub-protocols are not exec's.
    pf = node.cri.runtime.PortForward(pb.PortForwardRequest(pod_sandbox_id=sid)).url
    with pytest.raises(wsclient.Refused, match="403"):
        wsclient.connect(pf, ["v5.channel.k8s.io"])
    # The channel framing forwards the request's ports: a request naming none is refused.
    pf = node.cri.runtime.PortForward(pb.PortForwardRequest(pod_sandbox_id=sid)).url
    with pytest.raises(wsclient.Refused, match=r"400.*named none"):
        wsclient.connect(pf, ["v4.channel.k8s.io"])

    # A message over the frame bound closes the session with 1009 and the reason, and
    # the command's stdin ends with it (cat exits: nothing is left running).
    url = exec_url(node, cid, ["sh", "-c", "cat > /dev/null; echo gone > /tmp/ended"],
                   stdin=True, stdout=True)  # fmt: skip
    client = wsclient.connect(url, ["v5.channel.k8s.io"])
    try:
        client.send(wsclient.STDIN, b"x" * 1000)
        client.send(wsclient.STDIN, b"y" * MAX_FRAME)  # with its channel byte: 1 too many
        got = client.messages(timeout=15)
    finally:
        client.close()
    assert client.closed is not None and client.closed.code == 1009, client.closed
    assert f"limit is {MAX_FRAME}" in client.closed.reason
    assert ERROR not in [ch for ch, _ in got]  # the session was over before any status
    deadline = time.monotonic() + 10
    while node.exec(cid, "cat", "/tmp/ended").stdout != b"gone\n":
        assert time.monotonic() < deadline, "the command outlived its session"
        time.sleep(0.1)


def test_websocket_input_is_bounded(node: Node) -> None:
    """A client sending stdin faster than the command reads it (here: never) is held
    back by TCP once the channel's buffer is full; the daemon does not take it all."""
    sid, cfg = node.run_pod("ws-flood")
    cid = node.run(sid, cfg, "box", SLEEP)
    url = exec_url(node, cid, ["sleep", "30"], stdin=True, stdout=True)
    client = wsclient.connect(url, ["v5.channel.k8s.io"])
    sent = 0
    chunk = b"z" * (32 << 10)
    try:
        client.sock.settimeout(3)
        with pytest.raises(TimeoutError):
            while sent < 256 << 20:
                client.send(wsclient.STDIN, chunk)
                sent += len(chunk)
    finally:
        client.close()
    # 1 MiB for the channel, a pipe's 64 KiB, and what the two sockets' buffers hold.
    assert sent < 24 << 20, f"{sent >> 20} MiB taken from a client nobody reads"


def test_attach_over_websocket(node: Node) -> None:
    sid, cfg = node.run_pod("ws-attach")
    cid = node.run(sid, cfg, "shell", ["sh"], stdin=True, stdin_once=True)
    url = node.cri.runtime.Attach(
        pb.AttachRequest(container_id=cid, stdin=True, stdout=True, stderr=True)).url
    out = wsclient.run(url, stdin=b"echo attached; echo oops >&2\n")
    assert (out.stdout, out.stderr) == (b"attached\n", b"oops\n")
    assert out.status["status"] == "Success"
    # stdin_once: the close signal closed the shell's stdin, so it exited.
    deadline = time.monotonic() + 10
    while node.status(cid).state != pb.CONTAINER_EXITED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node.status(cid).state == pb.CONTAINER_EXITED


@pytest.mark.parametrize("protocol", ["v4.channel.k8s.io", "v4.base64.channel.k8s.io"])
def test_port_forward_over_websocket(node: Node, protocol: str) -> None:
    sid, cfg = node.run_pod(f"ws-pf-{len(protocol)}")
    # busybox nc answers one connection: reads a line, writes it back changed, hangs up.
    node.run(sid, cfg, "nc", ["nc", "-l", "-p", "9000", "-e", "sh", "-c",
                              'read line; echo "pod got $line"'])  # fmt: skip
    deadline = time.monotonic() + 15
    while True:
        url = node.cri.runtime.PortForward(
            pb.PortForwardRequest(pod_sandbox_id=sid, port=[9000])).url
        client = wsclient.connect(url, [protocol])
        try:
            assert client.protocol == protocol
            client.send(0, b"from the client\n")
            got = client.messages(timeout=15)
        finally:
            client.close()
        data = b"".join(p for ch, p in got[1:] if ch == 0)
        error = b"".join(p for ch, p in got[2:] if ch == 1)
        if data or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # nc not listening yet: the reason came on the error channel
    # Each channel's first message is the port, 2 bytes little-endian.
    prefix = struct.pack("<H", 9000)
    assert got[0] == (0, prefix) and got[1] == (1, prefix), got[:2]
    assert data == b"pod got from the client\n", (got, error)
    assert error == b"" and client.closed is not None and client.closed.code == 1000

    # Nothing listening: the reason on the port's error channel, then a normal closure.
    url = node.cri.runtime.PortForward(pb.PortForwardRequest(pod_sandbox_id=sid, port=[1])).url
    client = wsclient.connect(url, [protocol])
    try:
        got = client.messages(timeout=15)
    finally:
        client.close()
    error = b"".join(p for ch, p in got if ch == 1)
    assert b"refused" in error.lower(), got


def test_port_forward_spdy_tunnel(node: Node) -> None:
    """client-go's WebSocket port-forward: SPDY in binary messages, ports per stream."""
    sid, cfg = node.run_pod("ws-tunnel")
    node.run(sid, cfg, "nc", ["nc", "-l", "-p", "9000", "-e", "sh", "-c",
                              'read line; echo "tunnel got $line"'])  # fmt: skip
    deadline = time.monotonic() + 15
    while True:
        url = node.cri.runtime.PortForward(pb.PortForwardRequest(pod_sandbox_id=sid)).url
        reply, error = asyncio.run(wsclient.tunnel_forward_once(url, 9000, b"over spdy\n"))
        if reply or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (reply, error) == (b"tunnel got over spdy\n", b"")
