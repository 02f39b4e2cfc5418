"""Fixtures for the monitor tests: real runc/crun, conmon and busybox bundles, as root."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.monitor.ocibundle import Env, crun_unusable_reason, make_rootfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_rootfs(tmp_path_factory.mktemp("rootfs") / "rootfs")


@pytest.fixture(params=["runc", "crun"])
def env(request: pytest.FixtureRequest, tmp_path: Path, rootfs: Path) -> Iterator[Env]:
    if request.param == "crun" and (reason := crun_unusable_reason()):
        pytest.skip(reason)
    e = Env(tmp_path / "w", request.param, rootfs)
    yield e
    e.cleanup()


@pytest.fixture
def runc_env(tmp_path: Path, rootfs: Path) -> Iterator[Env]:
    e = Env(tmp_path / "w", "runc", rootfs)
    yield e
    e.cleanup()
