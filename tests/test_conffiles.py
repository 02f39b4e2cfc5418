"""Files pycri reads but did not write, at one door (pycri/conffiles.py, issue 41): the
CNI conf dir, registries.conf and its drop-ins, pycri's config. Before, a FIFO froze the
event loop, a directory or a link loop was INTERNAL, a link to /dev/zero grew the daemon
until it was killed, and deep nesting was INTERNAL RecursionError. Now each such file is
refused naming it and the reason, never its contents; in a conf dir it is skipped and
the good files are used."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pycri.config import Config, ConfigError, load
from pycri.errors import InvalidArgument
from pycri.image.reference import parse
from pycri.image.regconf import RegistriesConf
from pycri.network.conf import find_network

SECRET = "s3cr3t-in-a-file"


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _directory(p: Path) -> None:
    p.mkdir()


def _loop(p: Path) -> None:
    p.symlink_to(p.name)


def _zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


def _huge(p: Path) -> None:
    p.write_bytes(b" " * (2 << 20) + SECRET.encode())


def _deep_json(p: Path) -> None:
    p.write_text('{"cniVersion": "1.0.0", "name": "' + SECRET + '", "plugins": ' +
                 "[" * 100_000 + "]" * 100_000 + "}")


def _deep_toml(p: Path) -> None:
    p.write_text(f'# {SECRET}\nx = ' + "[" * 5000 + "]" * 5000 + "\n")


HOSTILE: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo, "directory": _directory, "loop": _loop, "dev-zero": _zero, "huge": _huge,
}
WHY = {"fifo": "not a regular file", "directory": "not a regular file", "loop": "many levels",
       "dev-zero": "not a regular file", "huge": "larger than 1048576 bytes",
       "deep": "nest", }


def _in_time(fn: Callable[[], object]) -> object:
    """`fn()` from a thread, within 5 s: a read that blocked (a FIFO) fails here."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result(timeout=5)


@pytest.mark.parametrize("kind", [*HOSTILE, "deep"])
def test_a_hostile_cni_conf_is_skipped_and_the_next_used(
        tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    bad = tmp_path / "00-bad.conflist"
    (HOSTILE.get(kind) or _deep_json)(bad)
    (tmp_path / "10-good.conflist").write_text(json.dumps(
        {"cniVersion": "1.0.0", "name": "good", "plugins": [{"type": "bridge"}]}))
    with caplog.at_level(logging.WARNING):
        net = _in_time(lambda: find_network(tmp_path))
    assert net is not None and net.name == "good"  # type: ignore[attr-defined]
    [line] = [r.getMessage() for r in caplog.records if "skipping CNI config" in r.getMessage()]
    assert str(bad) in line and WHY[kind] in line and SECRET not in line, line


@pytest.mark.parametrize("kind", [*HOSTILE, "deep"])
def test_a_hostile_registries_drop_in_is_skipped_and_the_main_file_refused(
        tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    main, dropins = tmp_path / "registries.conf", tmp_path / "registries.conf.d"
    dropins.mkdir()
    main.write_text('[[registry]]\nprefix = "example.com"\nlocation = "example.com"\n'
                    '[[registry.mirror]]\nlocation = "127.0.0.1:5000"\ninsecure = true\n')
    make = HOSTILE.get(kind) or _deep_toml
    make(dropins / "50-bad.conf")
    with caplog.at_level(logging.WARNING):
        conf = _in_time(lambda: RegistriesConf.load(str(main), str(dropins)))
    eps = conf.endpoints(parse("example.com/a:b"))  # type: ignore[attr-defined]
    assert eps[0].host == "127.0.0.1:5000"  # the good file still holds
    [line] = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert str(dropins / "50-bad.conf") in line and WHY[kind] in line and SECRET not in line
    main.unlink()
    make(main)
    with pytest.raises(InvalidArgument) as e:
        _in_time(lambda: RegistriesConf.load(str(main), str(dropins)))
    assert str(main) in str(e.value) and WHY[kind] in str(e.value)
    assert SECRET not in str(e.value)


@pytest.mark.parametrize("kind", [*HOSTILE, "deep"])
def test_a_hostile_config_file_is_one_clear_error(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "pycri.toml"
    (HOSTILE.get(kind) or _deep_toml)(path)
    with pytest.raises(ConfigError) as e:
        _in_time(lambda: load(path))
    assert str(e.value).startswith(f"config file {path}: ") and SECRET not in str(e.value)
    assert WHY[kind] in str(e.value), str(e.value)


def test_the_null_device_is_an_empty_file(tmp_path: Path) -> None:
    """`--config /dev/null` says "no config" (hack/build-deb.sh renders the defaults so):
    the null device reads as empty, where /dev/zero and other devices are refused."""
    (tmp_path / "linked.toml").symlink_to("/dev/null")
    assert load(Path("/dev/null")) == load(tmp_path / "linked.toml") == Config()
