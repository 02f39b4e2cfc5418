"""`pycri check` on this host, with real binaries and a real kernel probe: a root that
does not exist yet is probed (in stand-ins on the same filesystems), not reported as a
failure; the exit status is non-zero exactly when something the config needs fails;
advice fits the host (CRIU installed but failing is not told to install CRIU)."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycri.check import Check, run_checks
from pycri.config import CheckpointConfig, Config


@pytest.fixture
def base() -> Iterator[Path]:
    """An empty dir others can search (as /var/lib and /run are), on a disk filesystem."""
    path = Path("/var/tmp") / f"pycri-check-{secrets.token_hex(4)}"
    path.mkdir(mode=0o711)
    yield path
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)


def check(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycri", "check", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def by_name(results: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in results}


def test_a_fresh_root_is_probed_and_left_as_it_was(base: Path) -> None:
    root, state = base / "var" / "lib" / "pycri", base / "run" / "pycri"
    found = by_name(run_checks(Config(root=str(root), state=str(state))))
    for handler in ("runc", "crun"):
        c = found[f"user namespaces ({handler})"]
        assert c.ok and "hostUsers: false can run" in c.detail, c
        assert f"probed beside {base}" in c.detail, c.detail
    assert list(base.iterdir()) == []  # the stand-ins are gone, nothing was created
    with open("/proc/mounts") as f:
        assert not [line for line in f if str(base) in line]


def test_exit_status_is_zero_on_this_healthy_host(base: Path) -> None:
    out = check("--root", base / "root", "--state", base / "state")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[FAIL]" not in out.stdout


@pytest.mark.parametrize(("setting", "name", "fix"), [
    ('conmon = "{missing}"', "conmon",
     "set conmon to an installed conmon (apt-get install conmon puts it at /usr/bin/conmon)"),
    ('default_runtime = "mine"\n[runtimes.mine]\npath = "{missing}"', "runtime mine",
     "install the runtime at {missing}, or set runtimes.mine.path"),
], ids=["conmon", "default runtime"])
def test_a_missing_required_binary_fails_with_a_fix(base: Path, setting: str, name: str,
                                                    fix: str) -> None:
    missing = base / "nope"
    config = base / "pycri.toml"
    config.write_text(setting.format(missing=missing) + "\n")
    out = check("--config", config, "--root", base / "root", "--state", base / "state")
    assert out.returncode == 1, out.stdout
    assert f"[FAIL] {name}: {missing} not found\n       fix: {fix.format(missing=missing)}" \
        in out.stdout
    assert out.stdout.count("[FAIL]") == 1, out.stdout
    assert "1 required check failed" in out.stderr


def test_a_missing_extra_handler_only_warns(base: Path) -> None:
    config = base / "pycri.toml"
    config.write_text(f'[runtimes.kata]\npath = "{base / "kata"}"\n')
    out = check("--config", config, "--root", base / "root", "--state", base / "state")
    assert out.returncode == 0, out.stdout
    assert f"[warn] runtime kata: {base / 'kata'} not found" in out.stdout


FAILING_CRIU = """#!/bin/sh
case "$1" in
--version) echo "Version: 3.17.1" ;;
check) echo "Error (criu/vdso.c:1): vdso: Unexpected rt vDSO area bounds" >&2; exit 1 ;;
esac
"""


def test_an_installed_criu_that_fails_is_not_told_to_install_criu(tmp_path: Path) -> None:
    criu = tmp_path / "criu"
    criu.write_text(FAILING_CRIU)
    criu.chmod(0o755)
    c = by_name(run_checks(Config(checkpoint=CheckpointConfig(criu=str(criu)))))[
        "checkpoint/restore (CRIU)"]
    assert not c.ok and c.optional
    assert "apt-get" not in c.fix, c.fix
    assert c.fix.startswith(f"the installed CRIU (criu 3.17.1 at {criu}) fails `criu check` "
                            "on this kernel"), c.fix
    assert "a newer CRIU" in c.fix and "checkpoint.criu" in c.fix


def test_a_missing_criu_is_told_to_install_it(tmp_path: Path) -> None:
    c = by_name(run_checks(Config(checkpoint=CheckpointConfig(criu=str(tmp_path / "criu")))))[
        "checkpoint/restore (CRIU)"]
    assert not c.ok and c.optional and "apt-get install criu" in c.fix, c


def test_cni_plugins_outside_the_configured_dirs_are_pointed_at(tmp_path: Path) -> None:
    """The package's plugins are installed, only cni.bin_dirs misses them: installing the
    package again would not help."""
    cfg = Config()
    cfg.cni.bin_dirs = [str(tmp_path)]
    c = by_name(run_checks(cfg))["CNI plugins"]
    assert not c.ok and not c.optional
    assert c.fix == "add /usr/lib/cni to cni.bin_dirs (containernetworking-plugins put it there)"


def test_check_says_whether_the_kubelet_will_see_pycris_containers(tmp_path: Path) -> None:
    import os
    import socket

    from pycri.check import _cadvisor
    from pycri.config import CadvisorConfig

    default = tmp_path / "run" / "containerd" / "containerd.sock"

    def cfg(**kw: object) -> Config:
        return Config(state=str(tmp_path / "state"),
                      cadvisor=CadvisorConfig(default_path=str(default), **kw))  # type: ignore[arg-type]

    door = cfg().cadvisor_socket
    free = _cadvisor(cfg())
    assert free.ok and f"door {door} opens when pycri starts" in free.detail
    assert f"{default} is free: pycri links it at start" in free.detail
    default.parent.mkdir(parents=True)
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(default))
    other.listen()
    try:
        taken = _cadvisor(cfg())
        assert not taken.ok and taken.optional
        assert "served by another process" in taken.detail
        assert taken.fix == f"start the kubelet with --containerd={door}"
    finally:
        other.close()
    assert "dead socket: pycri takes it at start" in _cadvisor(cfg()).detail
    default.unlink()
    os.symlink(door, default)
    door.parent.mkdir(parents=True)
    mine = socket.socket(socket.AF_UNIX)
    mine.bind(str(door))
    mine.listen()
    try:
        linked = _cadvisor(cfg())
        assert linked.ok and f"door {door} answers; {default} leads to it" in linked.detail
    finally:
        mine.close()
    off = _cadvisor(cfg(enable=False))
    assert not off.ok and off.optional and off.fix == "set [cadvisor] enable = true"
    no_default = _cadvisor(Config(state=str(tmp_path / "state"),
                                  cadvisor=CadvisorConfig(default_path="")))
    assert no_default.ok and f"--containerd={door}" in no_default.detail


def test_check_names_what_was_set_aside(tmp_path: Path) -> None:
    from pycri.check import _set_aside
    from pycri.store import Store

    cfg = Config(root=str(tmp_path / "root"), state=str(tmp_path / "state"))
    assert _set_aside(cfg).ok  # nothing there yet
    store = Store(cfg.db_path)
    for rid in ("a", "b"):
        store.put("sandbox", rid, {"secret": "SECRET-VALUE"})
        store.set_aside("sandbox", rid)
    held = _set_aside(cfg)  # the daemon holds its database
    assert held.ok and "cannot be read now" in held.detail and "pycri_records_set_aside" in \
        held.detail
    store.close()
    aside = Path(cfg.root) / "cni-cache" / ".set-aside" / ("c" * 64 + ".1")
    aside.mkdir(parents=True)
    found = _set_aside(cfg)
    assert not found.ok and found.optional
    assert found.detail == (f"1 pod CNI cache in {aside.parent}, 2 sandbox rows")
    for name in ("pycri.db.damaged-20261207T101010Z", "pycri.db.damaged-20261207T101010Z-wal"):
        (Path(cfg.root) / name).write_bytes(b"junk")
    found = _set_aside(cfg)
    assert found.detail == (f"1 pod CNI cache in {aside.parent}, 1 damaged database in "
                            f"{cfg.root} (pycri.db.damaged-20261207T101010Z), 2 sandbox rows")
    assert "SECRET" not in found.detail + found.fix
