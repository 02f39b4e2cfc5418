"""Live state of pulls in flight (issue 42): phases, bytes that grow, clients, log lines."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest

from pycri.image import pull as pull_module
from tests.image.conftest import Maker
from tests.lib import images
from tests.lib.registry import HoldFront, Registry


def _big_layer_image(reg: Registry, layout: Path) -> str:
    entries = [images.directory("d")] + [images.file(f"d/f{i:04}", os.urandom(4096))
                                         for i in range(1000)]
    return images.push_image(reg.addr, layout, "watched", "v1",
                             [images.ImageSpec(layers=[[images.file("small", "x")], entries])])


async def test_a_held_pull_shows_its_phase_bytes_and_clients(
        make_manager: Maker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """Two clients pull one image whose big layer stops half-way: one pull in the
    state, downloading, two clients, the small layer done and the big one half
    fetched (and read by its unpack), with a log line carrying the same as fields;
    released, the pull ends and leaves the state."""
    monkeypatch.setattr(pull_module, "LOG_EVERY", 0.2)
    caplog.set_level(logging.INFO, "pycri.image")
    reg = Registry(tmp_path / "reg").start()
    front = HoldFront(reg.addr, over=100_000)
    front.start()
    try:
        ref = _big_layer_image(reg, tmp_path / "layout").replace(reg.addr, front.addr)
        m = make_manager()
        assert m.progress.snapshot() == []
        first = asyncio.ensure_future(m.pull(ref))
        second = asyncio.ensure_future(m.pull(ref))
        assert await asyncio.to_thread(front.holding.wait, 20)
        deadline = time.monotonic() + 10
        while True:
            (view,) = m.progress.snapshot()
            small, big = view.layers
            lines = [r for r in caplog.records if r.getMessage().startswith(f"pull of {ref}")]
            if small.done and big.fetched > 0 and big.unpacked > 0 and lines:
                break
            assert time.monotonic() < deadline, view
            await asyncio.sleep(0.05)
        assert view.reference == ref and view.phase == "downloading" and view.clients == 2
        assert 0 < big.fetched < big.size and not big.done and big.endpoint == front.addr
        assert big.unpacked <= big.fetched
        assert lines[-1].fields["phase"] == "downloading"  # type: ignore[attr-defined]
        assert lines[-1].fields["clients"] == 2  # type: ignore[attr-defined]
        front.release.set()
        assert await first == await second
        assert m.progress.snapshot() == []
    finally:
        front.release.set()
        front.stop()
        reg.stop()


def test_rate_and_eta_follow_the_last_seconds() -> None:
    from pycri.image.progress import RATE_WINDOW, LayerProgress

    layer = LayerProgress("sha256:" + "a" * 64, size=1000)
    assert layer.rate(0.0) == 0 and layer.eta(0.0) is None  # nothing known yet
    for t in range(5):
        layer.fetch(100, float(t))
    assert layer.rate(4.0) == pytest.approx(100.0)
    assert layer.eta(4.0) == pytest.approx(5.0)  # 500 bytes left at 100/s
    assert layer.rate(4.0 + RATE_WINDOW + 0.1) == 0  # stalled: no rate, no ETA
    assert layer.eta(4.0 + RATE_WINDOW + 0.1) is None
    layer.restart("mirror")
    assert layer.fetched == 0 and layer.endpoint == "mirror" and layer.rate(5.0) == 0


def test_a_pull_whose_bytes_are_all_in_shows_unpacking() -> None:
    from pycri.image.progress import LayerProgress, Progress

    progress = Progress()
    state = progress.begin("key", "example/app:v1", lambda: 1)
    a = progress.layer("chain-a", "sha256:" + "a" * 64, 10)
    b = progress.layer("chain-b", "sha256:" + "b" * 64, 20)
    state.layers = [a, b]
    state.enter("downloading")
    a.fetch(10, 0.0)
    b.fetch(5, 0.0)
    assert progress.snapshot()[0].phase == "downloading"
    b.fetch(15, 0.1)
    a.done = True
    assert progress.snapshot()[0].phase == "unpacking"  # b is in, not yet unpacked
    b.done = True
    assert progress.snapshot()[0].phase == "downloading"  # all done: commit is next
    assert isinstance(progress.layer("chain-a", a.digest, 10), LayerProgress)
    progress.end("key")
    assert progress.snapshot() == [] and progress._layers == {}
