"""The import layers in pyproject.toml (issue 24): the tree keeps them, and the contract
is not a check that cannot fail: an upward import, an import between siblings of one
layer, one under TYPE_CHECKING, or a module the contract does not place all break it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

LINT = REPO / ".venv" / "bin" / "lint-imports"
pytestmark = pytest.mark.skipif(not LINT.exists(), reason="lint-imports not installed")


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT), "--no-cache"], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the sources and the contract, to break."""
    shutil.copytree(REPO / "pycri", tmp_path / "pycri",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    return tmp_path


def test_the_tree_keeps_its_layers(tree: Path) -> None:
    done = lint(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pycri layers KEPT" in done.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("errors.py", "import pycri.daemon\n", "pycri.errors is not allowed to import pycri.daemon"),
    ("store/records.py", "from pycri.container import manager\n",
     "pycri.store is not allowed to import pycri.container"),
    ("nri/domain.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from pycri.container.manager import ContainerManager\n",
     "pycri.nri is not allowed to import pycri.container"),
    ("stats/usage.py", "import pycri.streaming\n",
     "pycri.stats is not allowed to import pycri.streaming"),
])
def test_an_import_against_the_layers_breaks_the_contract(
        tree: Path, module: str, line: str, broken: str) -> None:
    with open(tree / "pycri" / module, "a") as f:
        f.write(line)
    done = lint(tree)
    assert done.returncode != 0
    assert broken in done.stdout, done.stdout


def test_a_module_without_a_layer_breaks_the_contract(tree: Path) -> None:
    (tree / "pycri" / "unplaced.py").write_text('"""Nobody placed me."""\n')
    done = lint(tree)
    assert done.returncode != 0
    assert "unplaced" in done.stdout, done.stdout
