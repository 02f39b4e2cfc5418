"""Learn about container exits from conmon's exit files, without polling.

conmon writes the exit code to `<exit_dir>/<cid>` with glib's g_file_set_contents:
into a temporary `<cid>.XXXXXX` that is then renamed into place. The file is complete
at IN_MOVED_TO (or IN_CLOSE_WRITE for a writer that writes in place), so those are the
events we act on, and names shaped like glib's temporaries are ignored.
Exits that happened while pycri was down are found by `scan()`.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import re
import struct
from collections.abc import Callable, Collection
from pathlib import Path

log = logging.getLogger(__name__)

ExitCallback = Callable[[str, int, int], None]
"""Called as (container id, exit code, finished_at in ns since the epoch)."""

_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_Q_OVERFLOW = 0x00004000
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")
_TEMP_NAME = re.compile(r".+\.[A-Za-z0-9]{6}")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def parse_exit_code(text: str) -> int:
    """conmon writes a decimal; -1 means it could not tell (e.g. exec timeout)."""
    return int(text.strip())


def _is_exit_name(name: str) -> bool:
    return bool(name) and not name.startswith(".") and not _TEMP_NAME.fullmatch(name)


class ExitWatcher:
    """inotify on the exit directory, read from the asyncio loop via add_reader."""

    def __init__(self, exit_dir: Path, callback: ExitCallback) -> None:
        self.exit_dir = Path(exit_dir)
        self.callback = callback
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Begin watching; call scan() afterwards so no exit falls between the two."""
        self.exit_dir.mkdir(parents=True, exist_ok=True)
        fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_init1: {os.strerror(e)}")
        wd = _libc.inotify_add_watch(
            fd, os.fsencode(self.exit_dir), _IN_CLOSE_WRITE | _IN_MOVED_TO
        )
        if wd < 0:
            e = ctypes.get_errno()
            os.close(fd)
            raise OSError(e, f"inotify_add_watch {self.exit_dir}: {os.strerror(e)}")
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._on_readable)

    def close(self) -> None:
        if self._fd >= 0:
            assert self._loop is not None
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def scan(self) -> list[str]:
        """Report every exit file already present (exits while the daemon was down)."""
        seen = []
        for entry in sorted(os.scandir(self.exit_dir), key=lambda e: e.name):
            if entry.is_file() and _is_exit_name(entry.name) and self._report(entry.name):
                seen.append(entry.name)
        return seen

    def present(self, among: Collection[str]) -> list[str]:
        """Which of `among` have an exit file: one directory listing, no file read."""
        return sorted(n for n in os.listdir(self.exit_dir) if n in among)

    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        off = 0
        while off + _EVENT.size <= len(data):
            _wd, mask, _cookie, length = _EVENT.unpack_from(data, off)
            raw = data[off + _EVENT.size : off + _EVENT.size + length]
            off += _EVENT.size + length
            if mask & _IN_Q_OVERFLOW:
                log.warning("inotify queue overflow on %s; rescanning", self.exit_dir)
                self.scan()
                continue
            name = raw.split(b"\0", 1)[0].decode(errors="replace")
            if _is_exit_name(name):
                self._report(name)

    def report(self, cid: str) -> bool:
        """Deliver `cid`'s exit now if its file is complete (callers ignore repeats)."""
        return self._report(cid)

    def _report(self, cid: str) -> bool:
        path = self.exit_dir / cid
        try:
            st = path.stat()
            code = parse_exit_code(path.read_text())
        except FileNotFoundError:
            return False
        except ValueError:
            # Being written in place; its IN_CLOSE_WRITE will follow.
            return False
        try:
            self.callback(cid, code, st.st_mtime_ns)
        except Exception:
            log.exception("exit callback for %s failed", cid)
        return True
