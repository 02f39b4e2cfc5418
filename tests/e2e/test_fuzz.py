"""Structured fuzzing of every CRI request against a live daemon (bounded for CI).

hack/fuzz.py runs the same generator for as long as you like; see tests/lib/fuzz.py for
the generator, what keeps requests away from the host, and the oracle.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lib import fuzz
from tests.lib.registry import Registry

pytestmark = pytest.mark.e2e

REQUESTS = int(os.environ.get("PYCRI_FUZZ_REQUESTS", "300"))


@pytest.fixture
def fuzz_node(tmp_path: Path, registry: Registry, busybox: str) -> Iterator[fuzz.FuzzNode]:
    bridge = f"pcfz{secrets.token_hex(3)}"
    node = fuzz.start_node(tmp_path / "node", busybox, registry.addr, bridge,
                           f"10.196.{secrets.randbelow(250)}.0/24")
    try:
        yield node
    finally:
        status = fuzz.stop_node(node, tmp_path / "node")
        assert status == 0, node.proc.log_text()[-3000:]


def test_fuzz_every_rpc(fuzz_node: fuzz.FuzzNode, tmp_path: Path) -> None:
    """A few hundred generated requests: no INTERNAL/UNKNOWN, no hang, no crash, the
    daemon answers Version within 1 s after every batch, nothing leaked at the end."""
    fz = fuzz.Fuzzer(fuzz_node.proc, fuzz_node.pool, fuzz_node.ipam,
                     f"e2e-{fuzz_node.bridge}")
    try:
        problems = fuzz.run(fz, REQUESTS, batch=50, seed=None)
        fz.remove_all()
        leaks = {k: v for k, v in fz.leaks(tmp_path / "node").items() if v}
    finally:
        fz.channel.close()
    report = fz.report()
    print(report)
    assert fz.sent >= REQUESTS, report
    assert not fz.harness_errors, report
    assert problems == [], report
    assert leaks == {}, f"{leaks}\n{report}"
    assert not fz.findings, report
