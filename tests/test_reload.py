"""What a SIGHUP may change (pycri/reload.py), decided from two configs."""

from __future__ import annotations

import re

import pytest

from pycri import reload
from pycri.config import Config, ConfigError, RuntimeHandler


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
