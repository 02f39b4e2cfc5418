"""Pre-installed NRI plugins: executables in `plugin_path` that pycri starts itself.

As the protocol defines, a plugin file is named `<idx>-<name>` (idx: two digits) and
is started with one end of a socketpair as an inherited fd; its environment holds
only NRI_PLUGIN_SOCKET (that fd's number), NRI_PLUGIN_NAME and NRI_PLUGIN_IDX. Its
configuration is the text of `<idx>-<name>.conf` or else `<name>.conf` in
`plugin_config_path`, which the runtime passes in Configure.

This module only finds, starts and stops the processes; the adaptation wraps each
launched plugin's socket in a PluginLink and registers it like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from pycri import conffiles, procs

log = logging.getLogger(__name__)

# A plugin's index and name, as registered or as its file name `IDX-NAME` gives them
# (always matched whole).
PLUGIN_INDEX = re.compile(r"[0-9]{2}")
PLUGIN_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


@dataclass(frozen=True)
class Preinstalled:
    """A plugin found in plugin_path."""

    index: str
    name: str
    path: Path
    config: str  # "" when it has no config file


@dataclass
class Launched:
    """A started plugin: `sock` is the runtime's end (non-blocking, for PluginLink)."""

    plugin: Preinstalled
    sock: socket.socket
    process: asyncio.subprocess.Process


def parse_name(filename: str) -> tuple[str, str]:
    """(idx, name) of `<idx>-<name>`; ValueError saying what is wrong otherwise."""
    idx, sep, name = filename.partition("-")
    if not sep or not PLUGIN_INDEX.fullmatch(idx):
        raise ValueError(f"invalid NRI plugin name {filename!r}: <2-digit index>-<name> expected")
    if not PLUGIN_NAME.fullmatch(name):
        raise ValueError(f"invalid NRI plugin name {filename!r}: the name may only contain "
                         "[A-Za-z0-9_.+-]")
    return idx, name


def _config(config_dir: Path, idx: str, name: str) -> str:
    """The plugin's config file, read at the conffiles door (regular file, no blocking
    open, 1 MiB); ValueError naming the file if it cannot be read as one."""
    for candidate in (config_dir / f"{idx}-{name}.conf", config_dir / f"{name}.conf"):
        try:
            return conffiles.read_text(candidate)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            raise ValueError(f"config {candidate}: {conffiles.reason(e)}") from None
    return ""


def discover(plugin_dir: Path, config_dir: Path) -> list[Preinstalled]:
    """The executables in `plugin_dir`, in invocation order (index, then name).

    Blocking file work: call it in a worker thread. A missing directory is no plugin;
    a misnamed executable is skipped with a warning (it cannot be ordered), as is an
    unreadable config, so one bad file does not keep the others from starting."""
    try:
        entries = sorted(os.scandir(plugin_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    found = []
    for e in entries:
        if not e.is_file() or not os.access(e.path, os.X_OK):
            continue
        try:
            idx, name = parse_name(e.name)
            cfg = _config(config_dir, idx, name)
        except (ValueError, OSError) as err:
            log.warning("NRI: skipping pre-installed plugin %s: %s", e.path, err)
            continue
        found.append(Preinstalled(idx, name, Path(e.path), cfg))
    found.sort(key=lambda p: (p.index, p.name))
    return found


async def launch(plugin: Preinstalled) -> Launched:
    """Starts one plugin with its end of a fresh socketpair; OSError if it cannot run.

    The plugin runs in its own session so stop() can end whatever it spawned."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        env = {"NRI_PLUGIN_SOCKET": str(theirs.fileno()), "NRI_PLUGIN_NAME": plugin.name,
               "NRI_PLUGIN_IDX": plugin.index}
        proc = await asyncio.create_subprocess_exec(
            str(plugin.path), env=env, pass_fds=(theirs.fileno(),), cwd="/",
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    ours.setblocking(False)
    log.info("NRI: started pre-installed plugin %s-%s (pid %d)", plugin.index, plugin.name,
             proc.pid)
    return Launched(plugin, ours, proc)


async def launch_all(plugin_dir: Path, config_dir: Path) -> list[Launched]:
    """Every pre-installed plugin started, in order; one that fails to start is logged
    and left out (the others still run), as the protocol's runtimes do."""
    started = []
    for plugin in await asyncio.to_thread(discover, plugin_dir, config_dir):
        try:
            started.append(await launch(plugin))
        except OSError as e:
            log.warning("NRI: cannot start pre-installed plugin %s: %s", plugin.path, e)
    return started


async def stop(launched: Launched, grace: float = 2.0) -> int | None:
    """Ends a launched plugin: once its link is closed it normally exits by itself;
    after `grace` seconds it is killed with its process group. Returns its exit code.
    Closes `sock` too, in case no PluginLink ever took it over."""
    with contextlib.suppress(OSError):
        launched.sock.close()
    try:
        return await asyncio.wait_for(asyncio.shield(launched.process.wait()), grace)
    except TimeoutError:
        log.warning("NRI: pre-installed plugin %s-%s did not exit, killing it",
                    launched.plugin.index, launched.plugin.name)
        await procs.kill_and_reap(launched.process)
        return launched.process.returncode
