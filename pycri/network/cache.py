"""On-disk cache of what each pod's CNI ADD used and returned.

DEL must get the same config, runtimeConfig and prevResult as ADD, even after
a daemon restart, a reboot (state dir wiped) or an edit of the conf dir;
otherwise IP leases and iptables chains leak and the next ADD of the sandbox
fails with "duplicate allocation". So the cache lives under a persistent
directory, one JSON file per (sandbox, network), written atomically and
fsynced before the plugins run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from pycri import boundedjson, parsefail
from pycri.errors import FailedPrecondition, InvalidArgument
from pycri.together import in_thread

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
FORMAT = "pycri-cni-cache/v1"
# Unusable entries are moved here (never listed: the name is not a sandbox id).
SET_ASIDE = ".set-aside"


# One entry holds a network's config and a plugin's result: kilobytes. Past this it is
# not one pycri wrote.
MAX_ENTRY = 4 * 1024 * 1024


class CorruptEntry(FailedPrecondition):
    """A cache entry that cannot be read or used for a DEL; retrying will not help."""


def check_id(sandbox_id: str) -> None:
    if not _ID_RE.match(sandbox_id):
        raise InvalidArgument(f"invalid sandbox id {sandbox_id!r} for CNI")


class ResultCache:
    """`<root>/<sandbox id>/<network name>.json`; entries are plain dicts (see cni.py)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, sandbox_id: str, network: str) -> Path:
        check_id(sandbox_id)
        return self.root / sandbox_id / f"{network}.json"

    def _write_sync(self, sandbox_id: str, network: str, entry: dict[str, Any]) -> None:
        path = self._path(sandbox_id, network)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        data = json.dumps({"format": FORMAT, **entry}, indent=1).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _remove_sync(self, sandbox_id: str, network: str) -> None:
        self._path(sandbox_id, network).unlink(missing_ok=True)
        self._prune_sync(sandbox_id)

    def _prune_sync(self, sandbox_id: str) -> None:
        """Drop what a crash between a write and its rename left (`*.tmp`, never read:
        the plugins run only after the rename) and the directory once it is empty."""
        d = self.root / sandbox_id
        with contextlib.suppress(FileNotFoundError):
            for n in os.listdir(d):
                if n.endswith(".tmp"):
                    (d / n).unlink(missing_ok=True)
        # Fails while other networks of the sandbox are still cached: fine.
        with contextlib.suppress(OSError):
            d.rmdir()

    async def write(self, sandbox_id: str, network: str, entry: dict[str, Any]) -> None:
        await in_thread(self._write_sync, sandbox_id, network, entry)

    async def remove(self, sandbox_id: str, network: str) -> None:
        await in_thread(self._remove_sync, sandbox_id, network)

    async def prune(self, sandbox_id: str) -> None:
        check_id(sandbox_id)
        await in_thread(self._prune_sync, sandbox_id)

    def read_all(self, sandbox_id: str) -> list[dict[str, Any]]:
        """Every cached entry of the sandbox; an entry that cannot be read (not a regular
        file, too large, not JSON, an unknown format) raises CorruptEntry, never leaks
        silently. Files are opened without following a link or blocking (a FIFO)."""
        check_id(sandbox_id)
        d = self.root / sandbox_id
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".json"))
        except FileNotFoundError:
            return []
        except OSError as e:  # a file where the directory belongs, say
            raise CorruptEntry(f"CNI cache of sandbox {sandbox_id} is unreadable: "
                               f"{e.strerror}") from None
        entries = []
        for n in names:
            try:
                entry = json.loads(boundedjson.read_file(d / n, MAX_ENTRY))
            except ValueError as e:
                raise CorruptEntry(f"CNI cache file {d / n} is "
                                   f"{parsefail.invalid('JSON', e)}") from None
            except OSError as e:
                raise CorruptEntry(f"CNI cache file {d / n} is unreadable: "
                                   f"{e.strerror or e}") from None
            if not isinstance(entry, dict) or entry.get("format") != FORMAT:
                raise CorruptEntry(f"CNI cache file {d / n} has an unknown format")
            entries.append(entry)
        return entries

    def _set_aside_sync(self, sandbox_id: str) -> Path:
        check_id(sandbox_id)
        dest = self.root / SET_ASIDE / f"{sandbox_id}.{time.time_ns()}"
        dest.parent.mkdir(mode=0o700, exist_ok=True)
        os.rename(self.root / sandbox_id, dest)
        return dest

    async def set_aside(self, sandbox_id: str) -> Path:
        """Move a sandbox's unusable entries out of the way (kept for a person to read)."""
        return await in_thread(self._set_aside_sync, sandbox_id)

    def set_aside_count(self) -> int:
        """Pods' caches moved out of the way (see `set_aside`)."""
        try:
            return len(os.listdir(self.root / SET_ASIDE))
        except OSError:
            return 0

    def sandboxes(self) -> list[str]:
        """Sandbox ids with cached networks (for garbage collection at startup)."""
        try:
            return sorted(n for n in os.listdir(self.root) if _ID_RE.match(n))
        except FileNotFoundError:
            return []
