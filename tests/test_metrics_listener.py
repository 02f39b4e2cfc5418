"""The /metrics listener under a flood (issue 22, defect 4): a real `pycri serve` with a
metrics address, attacked with idle connections from loopback. The daemon's threads
and fds stay bounded, connections past the caps are closed at once, idle ones after
the head timeout, and the CRI socket answers Version throughout; a scrape still works
once the flood is gone."""

from __future__ import annotations

import contextlib
import gzip
import os
import resource
import select
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from pycri.api import api_pb2 as pb
from tests.conftest import PycriProcess
from tests.e2e.test_operator import _free_port

FLOOD = 400


@pytest.fixture(autouse=True)
def _fd_room() -> None:
    """The flood opens hundreds of sockets from this process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))


def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(f"{field}:"))


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _start(pycri_dirs: PycriProcess, tables: str = "") -> tuple[str, int]:
    """The daemon with a metrics address (and `tables` appended); (address, pid)."""
    address = f"127.0.0.1:{_free_port()}"
    text = pycri_dirs.config.read_text()
    pycri_dirs.config.write_text(f'metrics_address = "{address}"\n{text}{tables}')
    pycri_dirs.start()
    assert pycri_dirs.proc is not None
    return address, pycri_dirs.proc.pid


@contextlib.contextmanager
def _flood(address: str, n: int, source: str = "127.0.0.1") -> Iterator[list[socket.socket]]:
    """`n` connections that send nothing, closed on exit."""
    host, port = address.rsplit(":", 1)
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind((source, 0))
            s.connect((host, int(port)))
        yield socks
    finally:
        for s in socks:
            s.close()


def _hung_up(socks: list[socket.socket], wait: float = 0.0) -> int:
    """How many of `socks` the daemon has answered or closed (readable: a 503 or EOF)."""
    readable, _, _ = select.select(socks, [], [], wait)
    return len(readable)


def _wait_hung_up(socks: list[socket.socket], n: int, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while (done := _hung_up(socks, 0.2)) < n and time.monotonic() < deadline:
        pass
    return done


def _version(pycri: PycriProcess) -> None:
    client = pycri.client()
    try:
        assert client.runtime.Version(pb.VersionRequest(), timeout=5).runtime_name == "pycri"
    finally:
        client.channel.close()


def _scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        return resp.read().decode()


def test_idle_flood_is_bounded_and_the_cri_socket_answers(pycri_dirs: PycriProcess) -> None:
    """Defaults: 64 connections, 5 s for a request head."""
    address, pid = _start(pycri_dirs)
    try:
        assert "pycri_pods" in _scrape(address)
        threads, fds = _status(pid, "Threads"), _fds(pid)
        with _flood(address, FLOOD) as socks:
            time.sleep(1)  # let the daemon take in what it will
            _version(pycri_dirs)
            assert _status(pid, "Threads") <= threads + 16, "a thread per connection"
            assert _fds(pid) <= fds + 64 + 16, "connections past the cap kept"
            assert _wait_hung_up(socks, FLOOD - 64, 10) >= FLOOD - 64, "no connection cap"
            # Idle ones are closed after the head timeout (5 s; generous bound).
            assert _wait_hung_up(socks, FLOOD, 20) == FLOOD, "idle connections kept"
            _version(pycri_dirs)
        assert "pycri_pods" in _scrape(address)
        assert "metrics listener at its bound" in pycri_dirs.log_text()
    finally:
        assert pycri_dirs.stop() == 0, pycri_dirs.log_text()


def test_caps_are_config_keys_per_peer_and_in_all(pycri_dirs: PycriProcess) -> None:
    address, _ = _start(pycri_dirs, "[metrics]\nmax_connections = 24\n"
                        "max_connections_per_peer = 10\nheader_timeout = 30.0\n")
    try:
        with _flood(address, 20, "127.0.0.2") as a, _flood(address, 20, "127.0.0.3") as b:
            assert _wait_hung_up(a, 10, 10) == 10 and _wait_hung_up(b, 10, 10) == 10
            time.sleep(0.5)
            assert _hung_up(a) == 10 and _hung_up(b) == 10, "the per-peer cap let more in"
            # 20 held of 24: a third peer gets 4, then the total cap closes the rest.
            with _flood(address, 8, "127.0.0.4") as c:
                assert _wait_hung_up(c, 4, 10) == 4
                time.sleep(0.5)
                assert _hung_up(c) == 4, "the total cap let more in"
            _version(pycri_dirs)
        assert "pycri_pods" in _scrape(address)
    finally:
        assert pycri_dirs.stop() == 0, pycri_dirs.log_text()


def test_prometheus_scrape_and_bad_requests(pycri_dirs: PycriProcess) -> None:
    """What Prometheus asks for (OpenMetrics, gzip) is served; oversized or malformed
    heads, other paths and methods get their error status."""
    address, _ = _start(pycri_dirs)
    host, port = address.rsplit(":", 1)
    try:
        req = urllib.request.Request(f"http://{address}/metrics", headers={
            "Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
            "Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Encoding"] == "gzip"
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
            text = gzip.decompress(resp.read()).decode()
        assert "pycri_pods" in text and text.endswith("# EOF\n")
        for request, status in ((b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000, b" 400 "),
                                (b"garbage\r\n\r\n", b" 400 "),
                                (b"GET /nope HTTP/1.1\r\n\r\n", b" 404 "),
                                (b"POST /metrics HTTP/1.1\r\n\r\n", b" 405 ")):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(request)
                answer = b""
                with contextlib.suppress(ConnectionResetError):
                    while chunk := s.recv(65536):
                        answer += chunk
            assert status in answer.split(b"\r\n", 1)[0], (request[:40], answer[:200])
        _version(pycri_dirs)
    finally:
        assert pycri_dirs.stop() == 0, pycri_dirs.log_text()
