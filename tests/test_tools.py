"""The one lookup of tools no package registry provides (tests/lib/tools.py): a tool off
PATH skips its tests with the capability named, the override wins over PATH, and a run
ends with one "not exercised" line per capability (what hack/test.sh prints last)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import NOT_EXERCISED_FILE, REPO
from tests.lib import tools

BARE_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"  # no /usr/local/bin: crictl is not there


@pytest.fixture
def fresh_lookups() -> Iterator[None]:
    tools.problem.cache_clear()
    yield
    tools.problem.cache_clear()


@pytest.mark.usefixtures("fresh_lookups")
def test_a_tool_off_path_skips_naming_the_capability(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("PYCRI_TEST_CRICTL", raising=False)
    with pytest.raises(pytest.skip.Exception) as e:
        tools.require("crictl", "crictl JSON output")
    assert str(e.value) == ("not exercised: crictl JSON output (crictl not found: put it "
                            "on PATH or set PYCRI_TEST_CRICTL)")
    assert tools.needs("crictl", "x").kwargs["reason"].startswith("not exercised: x (")


@pytest.mark.usefixtures("fresh_lookups")
def test_the_override_wins_and_must_be_executable(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    fake = tmp_path / "my-crictl"
    fake.write_text("#!/bin/sh\n")
    monkeypatch.setenv("PATH", BARE_PATH)
    monkeypatch.setenv("PYCRI_TEST_CRICTL", str(fake))
    assert tools.problem("crictl") == f"{fake} (PYCRI_TEST_CRICTL) is not an executable"
    tools.problem.cache_clear()
    fake.chmod(0o755)
    assert tools.require("crictl", "x") == str(fake)


def test_a_run_without_crictl_says_what_it_did_not_cover(tmp_path: Path) -> None:
    missed = tmp_path / "missed"
    env = {k: v for k, v in os.environ.items() if k != "PYCRI_TEST_CRICTL"}
    env.update(PATH=BARE_PATH, **{NOT_EXERCISED_FILE: str(missed)})
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         "tests/e2e/test_stats_pressure.py::test_crictl_stats_json",
         "tests/streaming/test_crictl.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "5 skipped" in run.stdout, run.stdout + run.stderr
    why = "crictl not found: put it on PATH or set PYCRI_TEST_CRICTL"
    assert missed.read_text().splitlines() == [  # once per capability, not per test
        f"not exercised: crictl JSON output ({why})",
        f"not exercised: exec, attach and port-forward through crictl ({why})",
    ]
