"""What a SIGHUP may change (pycri/reload.py), decided from two configs."""

from __future__ import annotations

import dataclasses
import re

import pytest

from pycri import reload
from pycri.config import Config, ConfigError, NRIConfig, RuntimeHandler


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
