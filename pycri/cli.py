"""Command line: `pycri serve | config | check | pull | pulls | version`."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from pycri import __version__
from pycri.config import Config, ConfigError, load, to_toml, validate
from pycri.logs import setup_logging

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


def _checked(config_path: Path | None, check_binaries: bool, overrides: dict[str, Any]) -> Config:
    """Load and validate; raises ConfigError (also what `serve` reloads with on SIGHUP)."""
    cfg = load(config_path, overrides)
    validate(cfg, check_binaries=check_binaries)
    return cfg


def _load(config_path: Path | None, check_binaries: bool, **overrides: Any) -> Config:
    try:
        cfg = _checked(config_path, check_binaries, overrides)
    except ConfigError as e:
        click.echo(f"pycri: config: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    return cfg


@click.group()
@click.version_option(__version__, prog_name="pycri")
def main() -> None:
    """pycri: a Kubernetes CRI runtime."""


@main.command()
@_config_options
def serve(config_path: Path | None, **overrides: Any) -> None:
    """Serve the CRI RuntimeService and ImageService on a unix socket."""
    from pycri.daemon import Daemon, DaemonError

    _open_standard_fds()
    cfg = _load(config_path, check_binaries=True, **overrides)
    setup_logging(cfg)
    try:
        asyncio.run(Daemon(cfg, functools.partial(_checked, config_path, True, overrides)).run())
    except DaemonError as e:
        click.echo(f"pycri: {e}", err=True)
        sys.exit(1)


def _open_standard_fds() -> None:
    """Put /dev/null on any of fds 0-2 the daemon was started without (a CI runner, a
    careless init script): left closed, the next file or socket the daemon opens would
    take that number, and every child started with inherited stdio (conmon, runc, CNI
    plugins) would read or write it as its stdin, stdout or stderr."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: `fd` itself
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


@main.command("config")
@_config_options
def config_cmd(config_path: Path | None, **overrides: Any) -> None:
    """Print the effective configuration as TOML."""
    cfg = _load(config_path, check_binaries=False, **overrides)
    click.echo(to_toml(cfg), nl=False)


@main.command()
@_config_options
def check(config_path: Path | None, **overrides: Any) -> None:
    """Inspect the host: what works, what doesn't, and how to fix it. Exits 1 when
    something the config needs fails ([FAIL]); optional features only warn."""
    from pycri.check import run_checks

    cfg = _load(config_path, check_binaries=False, **overrides)
    failed = 0
    for result in run_checks(cfg):
        mark = "ok  " if result.ok else "warn" if result.optional else "FAIL"
        click.echo(f"[{mark}] {result.name}: {result.detail}")
        if not result.ok:
            failed += not result.optional
            if result.fix:
                click.echo(f"       fix: {result.fix}")
    if failed:
        click.echo(f"pycri check: {failed} required check{'s' * (failed > 1)} failed", err=True)
    sys.exit(1 if failed else 0)


def _daemon_socket(config_path: Path | None, overrides: dict[str, Any]) -> Path:
    return _load(config_path, check_binaries=False, **overrides).socket_path


@main.command("pull")
@click.argument("image")
@click.option("--creds", default=None, metavar="USER[:PASSWORD]",
              help="registry credentials (never printed)")
@_config_options
def pull_cmd(image: str, creds: str | None, config_path: Path | None,
             **overrides: Any) -> None:
    """Pull IMAGE through the daemon, showing its progress: bars on a terminal, a plain
    line per phase (and every few seconds) otherwise."""
    import grpc

    from pycri import watch
    from pycri.api import api_pb2 as cri
    from pycri.errors import InvalidArgument
    from pycri.image import reference

    try:
        normalized = str(reference.parse(image))
    except InvalidArgument as e:
        click.echo(f"pycri pull: {e}", err=True)
        sys.exit(2)
    auth = None
    if creds is not None:
        user, _, password = creds.partition(":")
        auth = cri.AuthConfig(username=user, password=password)
    ch = watch.channel(_daemon_socket(config_path, overrides))
    try:
        image_id = watch.pull(ch, image, normalized, sys.stdout, sys.stdout.isatty(), auth)
    except grpc.RpcError as e:
        click.echo(f"pycri pull: {e.code().name}: {e.details()}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    click.echo(f"pulled {normalized}: {image_id}")


@main.command("pulls")
@click.option("--watch", "live", is_flag=True, help="show them live until ^C")
@_config_options
def pulls_cmd(live: bool, config_path: Path | None, **overrides: Any) -> None:
    """Show the pulls the daemon has in flight: phase, bytes, rate, ETA per layer."""
    import grpc

    from pycri import watch

    ch = watch.channel(_daemon_socket(config_path, overrides))
    try:
        if live:
            watch.watch_pulls(ch, sys.stdout, sys.stdout.isatty())
        else:
            watch.print_pulls(watch.list_pulls(ch), sys.stdout)
    except grpc.RpcError as e:
        click.echo(f"pycri pulls: {e.code().name}: {e.details()}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        pass


@main.command()
def version() -> None:
    """Print pycri's version and the CRI API version it serves."""
    click.echo(f"pycri {__version__} (CRI runtime.v1)")
