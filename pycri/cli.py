"""Command line: `pycri serve | config | check | version`."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from pycri import __version__
from pycri.config import Config, ConfigError, load, to_toml, validate

# Exit status for a configuration error, so scripts can tell it from a crash.
EXIT_CONFIG = 2


def _config_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The flags that override the config file, shared by serve/config/check."""
    options = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(path_type=Path),
            default=None,
            help="TOML config file [default: /etc/pycri/pycri.toml if present]",
        ),
        click.option("--socket", default=None, help="gRPC unix socket path"),
        click.option("--root", default=None, help="persistent data dir"),
        click.option("--state", default=None, help="runtime state dir (tmpfs)"),
        click.option(
            "--log-level", default=None, type=click.Choice(["debug", "info", "warning", "error"])
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _load(config_path: Path | None, check_binaries: bool, **overrides: Any) -> Config:
    try:
        cfg = load(config_path, overrides)
        validate(cfg, check_binaries=check_binaries)
    except ConfigError as e:
        click.echo(f"pycri: config: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    return cfg


class _JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)  # server/oplog.py: one key per field
        if isinstance(fields, dict):
            entry.update((k, v) for k, v in fields.items() if k not in entry)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _setup_logging(cfg: Config) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if cfg.log_format == "json":
        handler.setFormatter(_JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.log_level.upper())


@click.group()
@click.version_option(__version__, prog_name="pycri")
def main() -> None:
    """pycri: a Kubernetes CRI runtime."""


@main.command()
@_config_options
def serve(config_path: Path | None, **overrides: Any) -> None:
    """Serve the CRI RuntimeService and ImageService on a unix socket."""
    from pycri.daemon import Daemon, DaemonError

    cfg = _load(config_path, check_binaries=True, **overrides)
    _setup_logging(cfg)
    try:
        asyncio.run(Daemon(cfg).run())
    except DaemonError as e:
        click.echo(f"pycri: {e}", err=True)
        sys.exit(1)


@main.command("config")
@_config_options
def config_cmd(config_path: Path | None, **overrides: Any) -> None:
    """Print the effective configuration as TOML."""
    cfg = _load(config_path, check_binaries=False, **overrides)
    click.echo(to_toml(cfg), nl=False)


@main.command()
@_config_options
def check(config_path: Path | None, **overrides: Any) -> None:
    """Inspect the host: what works, what doesn't, and how to fix it."""
    from pycri.check import run_checks

    cfg = _load(config_path, check_binaries=False, **overrides)
    failed = 0
    for result in run_checks(cfg):
        mark = "ok  " if result.ok else "FAIL"
        click.echo(f"[{mark}] {result.name}: {result.detail}")
        if not result.ok:
            failed += 1
            if result.fix:
                click.echo(f"       fix: {result.fix}")
    sys.exit(1 if failed else 0)


@main.command()
def version() -> None:
    """Print pycri's version and the CRI API version it serves."""
    click.echo(f"pycri {__version__} (CRI runtime.v1)")
