"""What a SIGHUP may change (pycri/reload.py), decided from two configs; and that a
running daemon refuses at reload what it refuses at start."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import time

import pytest

from pycri import reload
from pycri.config import Config, ConfigError, NRIConfig, RuntimeHandler
from tests.conftest import PycriProcess


def test_changed_keys_are_dotted_and_sorted() -> None:
    old = Config()
    new = Config(log_format="json", metrics_address="127.0.0.1:9090")
    new.runtimes = {**old.runtimes, "kata": RuntimeHandler(path="/usr/bin/kata")}
    new.runtimes["runc"] = RuntimeHandler(path="/opt/runc", timeout=5)
    new.images.registries_conf_dir = "/etc/pycri/registries.d"
    new.cni.bin_dirs = ["/opt/cni/bin"]
    changed = reload.changed_keys(old, new)
    assert changed == ["cni.bin_dirs", "images.registries_conf_dir", "log_format",
                       "metrics_address", "runtimes.kata", "runtimes.runc.path",
                       "runtimes.runc.timeout"]
    reload.check(old, new, changed)  # all of these apply live
    assert reload.changed_keys(old, Config()) == []


@pytest.mark.parametrize(("key", "change"), [
    ("root", lambda c: setattr(c, "root", "/srv/pycri")),
    ("images.ca_file", lambda c: setattr(c.images, "ca_file", "/etc/ca.pem")),
    ("cni.default_subnet", lambda c: setattr(c.cni, "default_subnet", "10.9.0.0/16")),
    ("runtimes.runc.root", lambda c: c.runtimes.__setitem__(
        "runc", RuntimeHandler(path="/usr/sbin/runc", root="/run/elsewhere"))),
])  # fmt: skip
def test_keys_that_need_a_restart_are_refused(key: str, change: object) -> None:
    old, new = Config(), Config()
    change(new)  # type: ignore[operator]
    with pytest.raises(ConfigError, match="^" + re.escape(key) + ": cannot change"):
        reload.check(old, new, reload.changed_keys(old, new))


@pytest.mark.parametrize("section", ["cdi", "checkpoint", "nri"])
def test_whole_sections_reload_even_keys_added_later(section: str) -> None:
    """[cdi], [checkpoint] and [nri] reload key by key through reload.assign: any key
    of theirs, also one a later change adds, is accepted and copied."""
    old, new = Config(), Config()
    reload.check(old, new, [f"{section}.a_key_added_later"])
    target, source = getattr(old, section), getattr(new, section)
    for f in dataclasses.fields(source):
        value = getattr(source, f.name)
        setattr(source, f.name, (not value) if isinstance(value, bool) else
                value * 2 if isinstance(value, (int, float)) else
                ["/x"] if isinstance(value, list) else "/x")
    changed = reload.changed_keys(old, new)
    assert changed == sorted(f"{section}.{f.name}" for f in dataclasses.fields(source))
    reload.check(old, new, changed)
    held = target
    reload.assign(target, source)
    assert getattr(old, section) is held and held == source  # in place: holders see it


def test_an_nri_listener_is_bound_only_when_connections_start_or_move() -> None:
    on = NRIConfig()
    cases = {
        "timeouts only": (NRIConfig(request_timeout=9, registration_timeout=9), False),
        "socket moves": (NRIConfig(socket_path="/run/nri2/nri.sock"), True),
        "connections allowed again": (on, True),
        "disabled": (NRIConfig(enable=False), False),
        "moved while connections are off": (
            NRIConfig(disable_connections=True, socket_path="/run/x.sock"), False),
    }
    olds = {"connections allowed again": NRIConfig(disable_connections=True)}
    for name, (new, expected) in cases.items():
        old = olds.get(name, on)
        assert reload.nri_needs_new_listener(old, new) is expected, name
    assert reload.nri_needs_new_listener(NRIConfig(enable=False), on)


def _sighup(pycri: PycriProcess, text: str) -> str:
    """Write the config, SIGHUP the daemon, return its reload line."""
    assert pycri.proc is not None
    start = len(pycri.log_text())
    pycri.config.write_text(text)
    os.kill(pycri.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        lines = [x for x in pycri.log_text()[start:].splitlines() if "config reload" in x]
        if lines:
            return lines[0]
        time.sleep(0.05)
    raise AssertionError(pycri.log_text()[start:])


@pytest.mark.parametrize(("table", "line", "key"), [
    ("[nri]", "request_timeout = nan", "nri.request_timeout"),
    ("[nri]", "registration_timeout = inf", "nri.registration_timeout"),
    ("[cni]", "plugin_timeout = nan", "cni.plugin_timeout"),
    ("[checkpoint]", "timeout = inf", "checkpoint.timeout"),
    ("[cdi]", "max_spec_bytes = 9223372036854775807", "cdi.max_spec_bytes"),
    ("[metrics]", "header_timeout = -inf", "metrics.header_timeout"),
    ("[cdi]", "spec_dirs = ['cdi']", "cdi.spec_dirs[0]"),
])
def test_reload_refuses_what_start_refuses(pycri: PycriProcess, table: str, line: str,
                                           key: str) -> None:  # fmt: skip
    """Issue 22, defect 6: the values SIGHUP took are refused naming the key, and the
    running config stays (a good reload after it changes only its own key)."""
    base = pycri.config.read_text()
    bad = base.replace(f"{table}\n", f"{table}\n{line}\n") if table in base else (
        f"{base}{table}\n{line}\n")
    refused = _sighup(pycri, bad)
    assert f"config reload refused, the running config stays: {key}: " in refused, refused
    assert _sighup(pycri, f"{base}[lists]\n").endswith(
        "config reloaded: nothing changed"), "the refused file's values were taken"
