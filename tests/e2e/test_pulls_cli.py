"""`pycri pulls` and `pycri pull` against a daemon (issue 42, items 2 and 5)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Node
from tests.lib import images
from tests.lib.registry import PaceFront, Registry

pytestmark = pytest.mark.e2e


def _cli(node: Node, *args: str) -> list[str]:
    return [sys.executable, "-m", "pycri", *args, "--config", str(node.proc.config),
            "--socket", str(node.proc.socket)]


def _paced_image(registry: Registry, tmp_path: Path, name: str) -> tuple[str, PaceFront]:
    """An image whose 4 MB layer comes 256 KiB every 0.15 s (about 2.5 s) through a
    front; returns its reference there and the front (started)."""
    entries = [images.directory("d")] + [images.file(f"d/f{i:04}", os.urandom(4096))
                                         for i in range(1000)]
    ref = images.push_image(registry.addr, tmp_path / name, name, "v1",
                            [images.ImageSpec(layers=[entries])])
    front = PaceFront(registry.addr, chunk=256 << 10, delay=0.15)
    front.start()
    return ref.replace(registry.addr, front.addr), front


def _fetched(text: str) -> float:
    """The MB fetched in `pycri pulls` output's first pull line."""
    m = re.search(r": downloading \d+s, ([\d.]+) MB of", text)
    assert m, text
    return float(m.group(1))


def test_pulls_shows_a_pull_in_flight_with_bytes_that_grow(node: Node, registry: Registry,
                                                           tmp_path: Path) -> None:
    ref, front = _paced_image(registry, tmp_path, "paced-pulls")
    try:
        assert "no pulls in flight" in subprocess.run(
            _cli(node, "pulls"), capture_output=True, text=True, check=True).stdout
        puller = subprocess.Popen(_cli(node, "pull", ref), stdout=subprocess.PIPE, text=True)
        seen: list[float] = []
        deadline = time.monotonic() + 30
        while len(seen) < 2 or seen[-1] <= seen[0]:
            assert time.monotonic() < deadline, seen
            out = subprocess.run(_cli(node, "pulls"), capture_output=True, text=True,
                                 check=True).stdout
            if ": downloading" in out:
                assert ref in out and "1 client(s)" in out
                assert re.search(r"  sha256:[0-9a-f]{12} ", out), out  # a line per layer
                seen.append(_fetched(out))
            time.sleep(0.3)
        out, _ = puller.communicate(timeout=60)
        assert puller.returncode == 0 and f"pulled {ref}: sha256:" in out
        assert "no pulls in flight" in subprocess.run(
            _cli(node, "pulls"), capture_output=True, text=True, check=True).stdout
    finally:
        front.stop()


def test_pull_to_a_pipe_writes_lines_and_two_clients_share_one_pull(
        node: Node, registry: Registry, tmp_path: Path) -> None:  # fmt: skip
    ref, front = _paced_image(registry, tmp_path, "paced-pipe")
    try:
        two = [subprocess.Popen(_cli(node, "pull", ref), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [p.communicate(timeout=60) for p in two]
        for p, (out, err) in zip(two, outs, strict=True):
            assert p.returncode == 0, err
            lines = out.splitlines()
            assert any(f"{ref}: downloading" in x for x in lines), out
            assert lines[-1].startswith(f"pulled {ref}: sha256:")
            assert "\x1b[" not in out  # no terminal codes on a pipe
        # Both printed the one pull's state, with both clients on it.
        assert all("2 client(s)" in out for out, _ in outs), outs
        assert front.requests.count(next(r for r in front.requests if "/blobs/" in r)) == 1
    finally:
        front.stop()


def test_pull_on_a_terminal_draws_bars(node: Node, registry: Registry, tmp_path: Path) -> None:
    ref, front = _paced_image(registry, tmp_path, "paced-tty")
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(_cli(node, "pull", ref), stdout=slave, stderr=subprocess.PIPE,
                             env={**os.environ, "COLUMNS": "120", "TERM": "xterm"})
        os.close(slave)
        out = b""
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, out
            try:
                data = os.read(master, 65536)
            except OSError:  # the other end closed: the command has ended
                break
            if not data:
                break
            out += data
        assert p.wait(30) == 0
        text = out.decode(errors="replace")
        assert "━" in text  # rich's bar
        assert "\x1b[" in text  # redrawn in place
        assert f"pulled {ref}: sha256:" in text
    finally:
        os.close(master)
        front.stop()


def _interruptible() -> None:
    """SIGINT as at a terminal: a shell's background job (CI's) passes it on ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_pulls_watch_on_a_pipe_writes_a_block_a_second_until_interrupted(node: Node) -> None:
    p = subprocess.Popen(_cli(node, "pulls", "--watch"), stdout=subprocess.PIPE, text=True,
                         preexec_fn=_interruptible)
    time.sleep(2.5)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=10)
    assert p.returncode == 0
    assert len(re.findall(r"^-- \d\d:\d\d:\d\d$", out, re.M)) >= 2, out
    assert out.count("no pulls in flight") >= 2
