"""sd_notify and socket activation, without systemd: the test plays the service manager.

A real `pycri serve` gets a unix datagram socket of ours as NOTIFY_SOCKET (and, for
activation, a listening socket of ours as fd 3, as systemd passes it).
"""

from __future__ import annotations

import configparser
import os
import socket
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc as pb_grpc
from pycri.daemon import READY_PROBE_TIMEOUT
from pycri.systemd import ActivationError, Notifier, grpc_target, listen_socket
from tests.conftest import REPO, PycriProcess


def _receiver(addr: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + addr[1:] if addr.startswith("@") else addr)
    sock.settimeout(20)
    return sock


def _version(target: str) -> pb.VersionResponse:
    with grpc.insecure_channel(target) as ch:
        return pb_grpc.RuntimeServiceStub(ch).Version(pb.VersionRequest(), timeout=10)


# --- the protocol pieces -------------------------------------------------------------


async def test_notify_reaches_an_abstract_address_and_leaves_the_environment() -> None:
    name = f"@pycri-test-{os.getpid()}"
    with _receiver(name) as rx:
        env = {"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "2000000", "KEEP": "1"}
        n = Notifier(env)
        n.notify("READY=1")
        assert rx.recv(4096) == b"READY=1"
        assert env == {"KEEP": "1"}  # conmon and runc must never see NOTIFY_SOCKET
        assert n.watchdog_interval == 1.0
        n.close()


def test_notify_without_systemd_is_a_no_op() -> None:
    n = Notifier({})
    n.notify("READY=1")
    assert n.watchdog_interval is None
    n.close()


def test_watchdog_of_another_pid_is_not_ours(tmp_path: Path) -> None:
    with _receiver(str(tmp_path / "n")):
        n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "n"), "WATCHDOG_USEC": "1000",
                      "WATCHDOG_PID": str(os.getpid() + 1)})
        assert n.watchdog_interval is None
        n.close()


def test_notify_never_blocks_on_a_full_queue(tmp_path: Path) -> None:
    """A manager that stops reading costs dropped messages, not a stalled loop."""
    with _receiver(str(tmp_path / "n")) as rx:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "n")})
        start = time.monotonic()
        for _ in range(2000):
            n.notify("WATCHDOG=1")
        assert time.monotonic() - start < 2
        assert rx.recv(64) == b"WATCHDOG=1"  # the first ones did arrive
        n.close()


def test_listen_socket_refuses_what_pycri_cannot_serve() -> None:
    assert listen_socket({}) is None
    assert listen_socket({"LISTEN_FDS": "1"}) is None  # no LISTEN_PID: not for us
    assert listen_socket({"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid() + 1)}) is None
    with pytest.raises(ActivationError, match="exactly one"):
        listen_socket({"LISTEN_FDS": "2", "LISTEN_PID": str(os.getpid())})


def test_grpc_target_names_path_and_abstract_sockets(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(tmp_path / "s"))
        assert grpc_target(s) == f"unix:{tmp_path / 's'}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind("\0pycri-abstract-test")
        assert grpc_target(s) == "unix-abstract:pycri-abstract-test"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        assert grpc_target(s) is None


# --- a real daemon ------------------------------------------------------------------


def _with_env(daemon: PycriProcess, **extra: str) -> None:
    daemon.env = {**os.environ, **extra}


@pytest.mark.e2e
def test_serve_notifies_ready_after_answering_watchdog_and_stopping(
    pycri_dirs: PycriProcess, tmp_path: Path
) -> None:
    addr = str(tmp_path / "notify")
    with _receiver(addr) as rx:
        _with_env(pycri_dirs, NOTIFY_SOCKET=addr, WATCHDOG_USEC="200000")
        seen: list[str | Exception] = []

        def on_ready() -> None:
            """Checks, the instant READY arrives, that the socket already answers."""
            seen.append(rx.recv(4096).decode())
            try:
                seen.append(_version(f"unix:{pycri_dirs.socket}").runtime_name)
            except grpc.RpcError as e:
                seen.append(e)

        watcher = threading.Thread(target=on_ready)
        watcher.start()  # before the daemon, which start() waits for until it answers
        pycri_dirs.start()
        try:
            watcher.join(timeout=20)
            first, answered = seen
            assert answered == "pycri", f"READY=1 came before the socket answered: {answered}"
            assert isinstance(first, str) and first.startswith("READY=1\n"), first
            assert pycri_dirs.proc is not None
            assert f"MAINPID={pycri_dirs.proc.pid}" in first.splitlines()
            pings = [rx.recv(4096) for _ in range(3)]
            assert pings == [b"WATCHDOG=1"] * 3
        finally:
            assert pycri_dirs.stop() == 0, pycri_dirs.log_text()
        rest = []
        rx.settimeout(0)
        while True:
            try:
                rest.append(rx.recv(4096))
            except BlockingIOError:
                break
        assert b"STOPPING=1" in rest, rest
        assert rest[-1] == b"STOPPING=1", rest  # no pings after it


def _activated(daemon: PycriProcess, listener: socket.socket) -> PycriProcess:
    """`daemon` started as systemd would: the listener as fd 3, LISTEN_PID its own pid."""
    fd = listener.fileno()
    wrapper = (
        "import os, sys; fd = int(sys.argv[1]); os.dup2(fd, 3); "
        "fd != 3 and os.close(fd); os.environ['LISTEN_PID'] = str(os.getpid()); "
        "os.execv(sys.argv[2], sys.argv[2:])"
    )
    argv = daemon.argv()

    class Activated(PycriProcess):
        def argv(self) -> list[str]:
            return [sys.executable, "-c", wrapper, str(fd), *argv]

    return Activated(
        root=daemon.root, state=daemon.state, socket=daemon.state / "grpc.sock",
        config=daemon.config, log=daemon.log,
        env={**os.environ, "LISTEN_FDS": "1"}, pass_fds=(fd,),
    )


@pytest.mark.e2e
def test_activated_listener_nobody_can_reach_fails_start(
    pycri_dirs: PycriProcess, tmp_path: Path
) -> None:
    """Its path unlinked, the socket answers no one: no READY=1, one line, exit 1."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(tmp_path / "gone.sock"))
        listener.listen(4)
        (tmp_path / "gone.sock").unlink()
        daemon = _activated(pycri_dirs, listener)
        daemon.start()  # its private grpc.sock answers; the READY probe then gives up
        assert daemon.proc is not None
        try:
            status = daemon.proc.wait(timeout=READY_PROBE_TIMEOUT + 20)
        finally:
            daemon.kill()
    assert status == 1, daemon.log_text()
    assert "does not answer Version" in daemon.log_text()
    assert not (daemon.state / "grpc.sock").exists()


@pytest.mark.e2e
def test_serve_on_a_socket_activated_listener(pycri_dirs: PycriProcess, tmp_path: Path) -> None:
    """fd 3 as systemd passes it: Version through it, and it is never unlinked."""
    public = tmp_path / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(public))
    listener.listen(64)
    daemon = _activated(pycri_dirs, listener)
    daemon.start()
    listener.close()  # systemd's copy would stay; ours is no longer needed
    try:
        assert _version(f"unix:{public}").runtime_name == "pycri"
        with grpc.insecure_channel(f"unix:{public}") as ch:
            stub = pb_grpc.RuntimeServiceStub(ch)
            for _ in range(20):  # several calls on one connection, as the kubelet does
                assert stub.Status(pb.StatusRequest(), timeout=10).status.conditions
        assert "socket-activated listener" in daemon.log_text()
        assert oct((daemon.state / "grpc.sock").stat().st_mode & 0o777) == "0o600"
    finally:
        assert daemon.stop() == 0, daemon.log_text()
    assert public.exists(), "the activated socket is systemd's: pycri must not unlink it"
    assert not (daemon.state / "grpc.sock").exists()


def test_unit_file_has_what_a_container_runtime_needs() -> None:
    """The settings that keep pods alive across restarts and the daemon alive under load."""
    unit = configparser.ConfigParser(interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(REPO / "contrib" / "systemd" / "pycri.service")
    service = unit["Service"]
    expected = {"Type": "notify", "KillMode": "process", "Delegate": "yes",
                "OOMScoreAdjust": "-999", "Restart": "always"}
    assert {k: service.get(k) for k in expected} == expected
    assert int(service["LimitNOFILE"]) >= 1 << 20
    assert int(service["WatchdogSec"]) > 0
    assert service["ExecStart"].split()[1] == "serve"
    sock = configparser.ConfigParser(interpolation=None)
    sock.read(REPO / "contrib" / "systemd" / "pycri.socket")
    assert sock["Socket"]["ListenStream"] == "/run/pycri/pycri.sock"
