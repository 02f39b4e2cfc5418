"""The streaming server's shared bounds: the fd budget and the rate-limited warnings."""

from __future__ import annotations

import logging
import resource
from collections.abc import Iterator

import pytest

from pycri.streaming.limits import Budget, RateLimitedLog, fd_budget


@pytest.fixture
def nofile_1024() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_fd_budget_leaves_the_reserve(nofile_1024: None) -> None:
    assert fd_budget(8192, 256) == 1024 - 256
    assert fd_budget(100, 256) == 100
    # A limit below the reserve: streaming gets half, the rest of the daemon the other half.
    assert fd_budget(8192, 1024) == 512


def test_budget_takes_only_what_is_free() -> None:
    b = Budget(10)
    assert b.take(8) and not b.take(3) and b.used == 8
    b.give(8)
    assert b.free == 10 and b.take(10)


def test_recurring_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    warn = RateLimitedLog(logging.getLogger("t"), interval=3600)
    with caplog.at_level(logging.WARNING):
        for _ in range(1000):
            warn.warning("k", "at the bound")
        warn.warning("other", "something else")
    assert [r.getMessage() for r in caplog.records] == ["at the bound", "something else"]
