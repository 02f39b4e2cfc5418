"""Shared fixtures: a real `pycri serve` on a temporary socket, and a CRI client for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2_grpc as pb_grpc
from tests.lib import tools

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT = 20.0
# Where the "not exercised" lines go (hack/test.sh prints them last); unset: the
# terminal summary.
NOT_EXERCISED_FILE = "PYCRI_NOT_EXERCISED_FILE"


@dataclass
class CRIClient:
    """A connected CRI client: `.runtime` and `.image` stubs over one channel."""

    channel: grpc.Channel
    runtime: pb_grpc.RuntimeServiceStub = field(init=False)
    image: pb_grpc.ImageServiceStub = field(init=False)

    def __post_init__(self) -> None:
        self.runtime = pb_grpc.RuntimeServiceStub(self.channel)
        self.image = pb_grpc.ImageServiceStub(self.channel)


@dataclass
class PycriProcess:
    """A running `pycri serve` subprocess with its own root, state and socket."""

    root: Path
    state: Path
    socket: Path
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    # Extra environment (None: inherit ours) and fds to hand over (socket activation).
    env: dict[str, str] | None = None
    pass_fds: tuple[int, ...] = ()
    # Run before the daemon's argv, which follows as its arguments (say, a shell that
    # closes the daemon's stdio and execs it).
    launcher: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pycri",
            "serve",
            "--config",
            str(self.config),
            "--root",
            str(self.root),
            "--state",
            str(self.state),
            "--socket",
            str(self.socket),
            "--log-level",
            "debug",
        ]

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.launcher, *self.argv()], stdout=log, stderr=subprocess.STDOUT, env=self.env,
                pass_fds=self.pass_fds,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pycri serve exited {self.proc.returncode}:\n{self.log_text()}")
            if self.socket.exists():
                try:
                    with grpc.insecure_channel(f"unix://{self.socket}") as ch:
                        grpc.channel_ready_future(ch).result(timeout=1)
                    return
                except grpc.FutureTimeoutError:
                    pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"pycri serve did not come up:\n{self.log_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal the daemon (by its pid) and wait; returns its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def client(self) -> CRIClient:
        return CRIClient(grpc.insecure_channel(f"unix://{self.socket}"))


NO_DEFAULT_CADVISOR = '[cadvisor]\ndefault_path = ""\n'


def write_config(path: Path, text: str = "") -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def pycri_dirs(tmp_path: Path) -> PycriProcess:
    """A not-yet-started daemon laid out under tmp_path (tests may edit its config)."""
    root, state = tmp_path / "root", tmp_path / "state"
    cni_dir = tmp_path / "net.d"
    cni_dir.mkdir()
    config = write_config(
        tmp_path / "pycri.toml",
        # cAdvisor's default path is the host's: a test daemon never links it. First, so
        # that keys a test appends without a table still land in [nri].
        f'{NO_DEFAULT_CADVISOR}[cni]\nconf_dir = "{cni_dir}"\n'
        f'[images]\nregistries_conf = "{tmp_path / "registries.conf"}"\n'
        f'registries_conf_dir = "{tmp_path / "registries.conf.d"}"\n'
        f'[nri]\nsocket_path = "{tmp_path / "nri.sock"}"\n'
        f'plugin_path = "{tmp_path / "nri-plugins"}"\n'
        f'plugin_config_path = "{tmp_path / "nri-conf.d"}"\n',
    )
    return PycriProcess(
        root=root,
        state=state,
        socket=state / "pycri.sock",
        config=config,
        log=tmp_path / "pycri.log",
    )


@pytest.fixture
def pycri(pycri_dirs: PycriProcess) -> Iterator[PycriProcess]:
    """A running daemon; stopped by pid at teardown, its exit status checked."""
    pycri_dirs.start()
    try:
        yield pycri_dirs
    finally:
        status = pycri_dirs.stop()
        assert status == 0, f"pycri serve exited {status}:\n{pycri_dirs.log_text()}"
        assert not pycri_dirs.socket.exists(), "socket left behind after shutdown"


@pytest.fixture
def cri(pycri: PycriProcess) -> Iterator[CRIClient]:
    client = pycri.client()
    try:
        yield client
    finally:
        client.channel.close()


@pytest.fixture(autouse=True)
def _root_only(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("e2e") and os.geteuid() != 0:
        pytest.skip("end-to-end tests run as root")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say what a green run did not cover: one line per capability whose tool is missing."""
    lines = tools.not_exercised(terminalreporter.stats.get("skipped", []))
    if target := os.environ.get(NOT_EXERCISED_FILE):
        Path(target).write_text("".join(f"{line}\n" for line in lines))
    elif lines:
        terminalreporter.section("not exercised")
        for line in lines:
            terminalreporter.write_line(line)
