"""Tools no package registry provides (crictl, critest, a kubelet, checkpointctl, a CRIU
that works on this kernel), found in one place so that a bare machine skips what needs
them instead of failing.

A tool is `PYCRI_TEST_<NAME>` when that is set, else `<name>` on PATH. A test that
needs one asks `require` (in its body or a fixture) or carries `needs` (a skipif
marker); either skips with a reason of the form "not exercised: <capability> (<why>)",
which tests/conftest.py gathers, one line per capability, at the end of the run.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
from collections.abc import Callable

import pytest

from pycri.config import CheckpointConfig
from pycri.criu.support import probe_criu

NOT_EXERCISED = "not exercised: "


def env_name(name: str) -> str:
    """The override variable: PYCRI_TEST_CRICTL for crictl."""
    return "PYCRI_TEST_" + name.upper().replace("-", "_")


def find(name: str) -> str | None:
    """The tool's path (the override, else PATH), or None."""
    return os.environ.get(env_name(name)) or shutil.which(name)


def _criu_problem(path: str) -> str | None:
    """CRIU is only useful where `criu check` accepts this kernel."""
    return asyncio.run(probe_criu(CheckpointConfig(criu=path, check_timeout=120))).problem


# Tools whose presence is not enough: path -> why it cannot serve, or None.
_PROBES: dict[str, Callable[[str], str | None]] = {"criu": _criu_problem}


@functools.cache
def problem(name: str) -> str | None:
    """Why the tool cannot be used here, or None (asked once per run)."""
    path = find(name)
    if path is None:
        return f"{name} not found: put it on PATH or set {env_name(name)}"
    if not os.access(path, os.X_OK):
        return f"{path} ({env_name(name)}) is not an executable"
    probe = _PROBES.get(name)
    why = probe(path) if probe else None
    return f"{why}; set {env_name(name)} to one that works" if why else None


def skip_reason(capability: str, why: str) -> str:
    return f"{NOT_EXERCISED}{capability} ({why})"


def require(name: str, capability: str) -> str:
    """The tool's path; skips the test, naming `capability`, where it cannot be used."""
    why = problem(name)
    if why is not None:
        pytest.skip(skip_reason(capability, why))
    path = find(name)
    assert path is not None
    return path


def needs(name: str, capability: str) -> pytest.MarkDecorator:
    """A skipif marker for tests (or a module's pytestmark) that need the tool."""
    why = problem(name)
    return pytest.mark.skipif(why is not None, reason=skip_reason(capability, why or ""))


def not_exercised(skipped: list[pytest.TestReport]) -> list[str]:
    """One line per capability the skipped tests would have covered, in first-seen order."""
    lines: dict[str, None] = {}
    for report in skipped:
        if isinstance(report.longrepr, tuple):
            reason = report.longrepr[2].removeprefix("Skipped: ")
            if reason.startswith(NOT_EXERCISED):
                lines[reason] = None
    return list(lines)
