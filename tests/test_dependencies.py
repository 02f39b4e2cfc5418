"""Every dependency pyproject.toml declares is imported by pycri, and everything pycri
imports from outside the standard library is declared (issue 13, item 6)."""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from importlib import metadata

from tests.conftest import REPO


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _declared() -> set[str]:
    with open(REPO / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return {_norm(re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0]) for d in deps}


def _imported() -> set[str]:
    """Top-level module names pycri's code imports (absolute imports only)."""
    names: set[str] = set()
    for path in (REPO / "pycri").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def _dists_of(module: str) -> set[str]:
    return {_norm(d) for d in _distributions().get(module, [])}


def test_every_declared_dependency_is_imported() -> None:
    declared = _declared()
    assert declared, "no dependencies parsed from pyproject.toml"
    used = set().union(*(_dists_of(m) for m in _imported()))
    unused = declared - used
    assert not unused, f"declared in pyproject.toml but never imported by pycri: {unused}"


def test_every_third_party_import_is_declared() -> None:
    third_party = {m for m in _imported()
                   if m != "pycri" and m not in sys.stdlib_module_names}
    missing = {m: _dists_of(m) for m in third_party if not _dists_of(m) & _declared()}
    assert not missing, f"imported by pycri but not declared in pyproject.toml: {missing}"
