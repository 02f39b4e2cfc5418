"""What a SIGHUP may change in a running daemon, decided before anything is applied.

A reload is all or nothing: the new file must load and validate, and every key that
differs must be one the daemon can take live. Anything else (root, state, the socket,
the cgroup driver, a handler's state root...) is refused with the key named, because
taking it live would orphan running pods or their runtime state; those need a restart.

Whole sections ([metrics], [cdi], [checkpoint], [nri]) reload key by key as their owners read
them, so a key added to one later reloads too (docs/operating.md lists the effects).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pycri.config import Config, ConfigError, NRIConfig

# Dotted keys (or prefixes ending in ".") a running daemon applies (Daemon.reload).
RELOADABLE = (
    "log_level", "log_format", "default_runtime", "runtimes.", "metrics_address", "metrics.",
    "images.registries_conf", "images.registries_conf_dir", "pause_image", "cni.conf_dir",
    "cni.bin_dirs", "cni.plugin_timeout", "cdi.", "checkpoint.", "nri.",
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


def assign(target: Any, source: Any) -> None:
    """Every field of the dataclass `source` into `target`, in place: whoever holds
    `target` (a manager, the NRI adaptation) reads the new values from now on."""
    for f in dataclasses.fields(target):
        setattr(target, f.name, getattr(source, f.name))


def nri_listens(c: NRIConfig) -> bool:
    return c.enable and not c.disable_connections


def nri_needs_new_listener(old: NRIConfig, new: NRIConfig) -> bool:
    """Whether the reload must bind `new.socket_path` (before anything is applied):
    connections are newly allowed, or allowed on another path."""
    return nri_listens(new) and (not nri_listens(old) or new.socket_path != old.socket_path)
