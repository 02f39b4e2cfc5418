"""What a SIGHUP may change in a running daemon, decided before anything is applied.

A reload is all or nothing: the new file must load and validate, and every key that
differs must be one the daemon can take live. Anything else (root, state, the socket,
the cgroup driver, a handler's state root...) is refused with the key named, because
taking it live would orphan running pods or their runtime state; those need a restart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pycri.config import Config, ConfigError

# Dotted keys (or prefixes ending in ".") a running daemon applies (Daemon.reload).
RELOADABLE = (
    "log_level", "log_format", "default_runtime", "runtimes.", "metrics_address",
    "images.registries_conf", "images.registries_conf_dir", "pause_image", "cni.conf_dir",
    "cni.bin_dirs", "cni.plugin_timeout",
)  # fmt: skip


def changed_keys(old: Config, new: Config) -> list[str]:
    """The dotted keys whose values differ, in a stable order."""
    return sorted(_diff(dataclasses.asdict(old), dataclasses.asdict(new), ""))


def _diff(a: Any, b: Any, prefix: str) -> set[str]:
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return set() if a == b else {prefix}
    out: set[str] = set()
    for k in a.keys() | b.keys():
        key = f"{prefix}.{k}" if prefix else k
        out |= _diff(a[k], b[k], key) if k in a and k in b else {key}
    return out


def _reloadable(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in RELOADABLE)


def check(old: Config, new: Config, changed: list[str]) -> None:
    """Raise ConfigError naming the first key a reload cannot take."""
    for key in changed:
        if not _reloadable(key):
            raise ConfigError(f"{key}: cannot change without a restart")
    for name in old.runtimes.keys() & new.runtimes.keys():
        # A handler's containers live in its state root: moving it loses them.
        if new.runtime_root(name) != old.runtime_root(name):
            raise ConfigError(f"runtimes.{name}.root: cannot change without a restart")
