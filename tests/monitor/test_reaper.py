"""The pidfd child watcher and the reaper's sweep, each scenario in its own subreaper."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.conftest import REPO


def run(scenario: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.monitor.reaping", scenario],
        cwd=REPO, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_reparented_grandchild_is_reaped_without_sigchld() -> None:
    assert run("grandchild") == {
        "reparented": True, "reaped": True, "sigchld_default": True, "pidfd_watcher": True,
    }  # fmt: skip


def test_awaited_exit_statuses_are_never_stolen() -> None:
    result = run("no_steal")
    assert result["count"] == 300
    assert result["wrong"] == []
    assert result["watched_code"] == 7
    assert result["warnings"] == []
    assert result["zombies"] == []


def test_pidfd_for_a_pid_that_already_exited() -> None:
    assert run("exited_pid") == {"zombie_code": 3, "zombie_reaped": True, "gone_status": None}


def test_hold_keeps_new_zombies_for_their_watcher_only() -> None:
    assert run("hold") == {"before_reaped": True, "during_kept": True, "during_reaped": True}
