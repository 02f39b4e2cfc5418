"""Fixtures for the network tests: a private CNI world per test, cleaned up even on failure."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pycri.network import remove_netns
from tests.network.helpers import TAG, NetEnv, next_n, purge_nat_rules, run, subnet_for


@pytest.fixture
async def netenv() -> AsyncIterator[NetEnv]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    n = next_n()
    root = Path(tempfile.mkdtemp(prefix="pycri-net-test-"))
    env = NetEnv(root=root, bridge=f"pcri{TAG}{n:03d}"[:15],
                 subnet=subnet_for(n), prefix=f"pcritest{TAG}x{n}")
    try:
        yield env
    finally:
        # Undo in reverse: CNI state (releases leases, iptables), netns, bridge, dirs.
        if env.managers:
            for pod in env.pods:
                with contextlib.suppress(Exception):
                    await env.managers[0].teardown(pod)
        for ns in env.netns:
            await remove_netns(ns)
        run("ip", "link", "del", env.bridge, check=False)
        purge_nat_rules(env.prefix)
        shutil.rmtree(root, ignore_errors=True)
