"""A real `pycri serve` with NRI enabled cannot be hurt through its NRI socket:
garbage, peers that never register, and 200 connect/disconnect cycles leave it
serving CRI and plugins, with no fd left behind."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from pycri.nri import mux, ttrpc
from tests.conftest import PycriProcess
from tests.lib.nri_plugin import PluginThread


def _nri_socket(p: PycriProcess) -> str:
    return str(p.config.parent / "nri.sock")


def _daemon_fds(p: PycriProcess) -> int:
    assert p.proc is not None
    return len(os.listdir(f"/proc/{p.proc.pid}/fd"))


def _settles_to(p: PycriProcess, want: int, wait: float = 15.0) -> int:
    deadline = time.monotonic() + wait
    while (n := _daemon_fds(p)) > want and time.monotonic() < deadline:
        time.sleep(0.1)
    return n


def _full_plugin(path: str, name: str = "churn") -> None:
    with PluginThread(name, "30") as pt:
        pt.connect(path)
        pt.wait_for("Synchronize")


def _serving(p: PycriProcess) -> None:
    client = p.client()
    try:
        assert client.runtime.Version(pb.VersionRequest(), timeout=5).runtime_name == "pycri"
    finally:
        client.channel.close()


@pytest.fixture
def daemon(pycri_dirs: PycriProcess) -> PycriProcess:
    with open(pycri_dirs.config, "a") as f:
        f.write("registration_timeout = 1.0\nrequest_timeout = 1.0\n")
    return pycri_dirs


@pytest.fixture
def running(daemon: PycriProcess) -> Iterator[PycriProcess]:
    daemon.start()
    yield daemon
    status = daemon.stop()
    assert status == 0, daemon.log_text()[-3000:]


def _raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s


def _dropped(s: socket.socket) -> bool:
    """The daemon closed the connection: EOF, or a reset when it closed with bytes of
    ours still unread (what a unix socket does then); a silence times out instead."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_connect_disconnect_200_times_leaks_no_daemon_fd(running: PycriProcess) -> None:
    path = _nri_socket(running)
    _full_plugin(path)  # warm up: first-use allocations are not leaks
    baseline = _settles_to(running, 0, wait=2)
    for i in range(200):
        kind = i % 4
        if kind == 0:
            _full_plugin(path)
            continue
        s = _raw(path)
        if kind == 2:  # half a frame, then gone
            s.sendall(struct.pack(">II", mux.RUNTIME_SERVICE_CONN, 100) + b"abc")
        elif kind == 3:  # a registration it never waits for
            req = ttrpc.RequestMsg(service="nri.pkg.api.v1alpha1.Runtime",
                                   method="RegisterPlugin").SerializeToString()
            s.sendall(mux.frames(mux.RUNTIME_SERVICE_CONN, ttrpc.encode(1, 1, req)))
        s.close()
    assert _settles_to(running, baseline) <= baseline
    _serving(running)
    _full_plugin(path, "after")  # and plugins still get in


def test_garbage_and_silent_peers_do_not_disturb_a_good_plugin(running: PycriProcess) -> None:
    path = _nri_socket(running)
    with PluginThread("good", "10") as good:
        good.connect(path)
        good.wait_for("Synchronize")
        # Random bytes: the daemon drops that connection.
        junk = _raw(path)
        junk.sendall(os.urandom(1 << 16))
        assert _dropped(junk)
        # A peer that never registers is dropped after registration_timeout (1 s).
        silent = _raw(path)
        start = time.monotonic()
        assert _dropped(silent)
        assert time.monotonic() - start < 5
        # An oversized frame: dropped with a clear log line.
        big = _raw(path)
        big.sendall(struct.pack(">II", mux.RUNTIME_SERVICE_CONN, 64 << 20))
        assert _dropped(big)
        for s in (junk, silent, big):
            s.close()
        assert good.is_connected()
        _serving(running)
    assert "exceeds the 4194314-byte limit" in running.log_text()


def test_nri_socket_is_private(running: PycriProcess) -> None:
    st = Path(_nri_socket(running)).stat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o600, 0)
