"""pycri built as a wheel and installed into a fresh venv works without the source tree.

The venv gets pycri from the wheel only (`--no-deps`); its dependencies come from this
interpreter's site-packages through a .pth line. Installing them from an index took
25 s here (python-prctl compiles) and needs the network, for what pip already
verified; the thing under test is pycri's own packaging (package data, entry point),
not its dependency pins.
The .pth adds a directory to sys.path without running that directory's own .pth files,
so the editable pycri of the checkout never shadows the wheel (asserted below).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO, PycriProcess

pytestmark = pytest.mark.wheel

# Whatever makes the build or install slow (or a venv from this interpreter) fails here.
TIMEOUT = 300


def _clean_env() -> dict[str, str]:
    """Our environment minus what would put the checkout on the wheel's sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(argv: list[str | Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
        timeout=TIMEOUT,
    )


def _has_build_backend() -> bool:
    """This venv's setuptools meets pyproject's `requires`: build offline with it.

    Otherwise pip builds in isolation and fetches the backend (CI has an index).
    """
    try:
        import setuptools
    except ImportError:
        return False
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    (spec,) = [r for r in requires if r.startswith("setuptools>=")]
    need = tuple(int(x) for x in spec.removeprefix("setuptools>=").split("."))
    have = tuple(int(x) for x in setuptools.__version__.split(".")[: len(need)])
    return have >= need


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with pycri installed from a wheel built off a copy of the tree."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "pycri", src / "pycri", ignore=shutil.ignore_patterns("__pycache__"))
    isolation = ["--no-build-isolation"] if _has_build_backend() else []
    build = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", tmp / "dist", src],
        cwd=tmp,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = (tmp / "dist").glob("pycri-*.whl")

    venv = tmp / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    made = _run([base, "-m", "venv", "--without-pip", venv], cwd=tmp)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   cwd=tmp).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "_pycri_test_deps.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    inst = _run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
         wheel],
        cwd=tmp,
    )
    assert inst.returncode == 0, inst.stdout + inst.stderr
    return venv


def test_wheel_imports_pycri_from_the_venv_not_the_checkout(venv: Path) -> None:
    out = _run([venv / "bin" / "python", "-c", "import pycri; print(pycri.__file__)"], cwd=venv)
    assert out.returncode == 0, out.stderr
    where = Path(out.stdout.strip())
    assert where.is_relative_to(venv), where
    data = sorted(p.name for p in (where.parent / "data").iterdir())
    assert {"pycri-default.conflist", "seccomp-default.json"} <= set(data), data


def test_wheel_check_finds_its_package_data(venv: Path, tmp_path: Path) -> None:
    out = _run([venv / "bin" / "pycri", "check", "--root", tmp_path / "root"], cwd=tmp_path)
    lines = out.stdout.splitlines()
    (line,) = [x for x in lines if "package data" in x]
    assert line.startswith("[ok  ]") and str(venv) in line, out.stdout + out.stderr


@pytest.mark.e2e
def test_wheel_serves_version(venv: Path, pycri_dirs: PycriProcess) -> None:
    """`pycri serve` from the wheel answers Version and renders the shipped default network."""
    from pycri.api import api_pb2 as pb

    class WheelPycri(PycriProcess):
        def argv(self) -> list[str]:
            return [str(venv / "bin" / "pycri"), *super().argv()[3:]]

    daemon = WheelPycri(**{k: getattr(pycri_dirs, k) for k in
                           ("root", "state", "socket", "config", "log")}, env=_clean_env())
    assert daemon.argv()[1] == "serve"
    daemon.start()
    try:
        client = daemon.client()
        with client.channel:
            version = client.runtime.Version(pb.VersionRequest(), timeout=10)
            status = client.runtime.Status(pb.StatusRequest(verbose=True), timeout=10)
        assert version.runtime_name == "pycri"
        net = [c for c in status.status.conditions if c.type == "NetworkReady"]
        assert net and net[0].status, status
    finally:
        assert daemon.stop() == 0, daemon.log_text()
