"""Metadata store: SQLite on disk, a dict in memory.

Every state change is written through to SQLite before the RPC that made it
returns, so a crash loses nothing; reads never touch SQLite, so the kubelet's
hot path (List*, *Status) costs a dict lookup. Records are JSON documents
grouped by kind ("sandbox", "container", "image", ...); each domain module
owns the shape of its own records.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pycri import boundedjson, parsefail
from pycri.errors import ResourceExhausted, filesystem, host_fault

Record = dict[str, Any]
T = TypeVar("T")
SET_ASIDE = "set-aside:"  # kind prefix of records their owner could not load
_SET_ASIDE_RANGE = (SET_ASIDE, SET_ASIDE[:-1] + ";")  # kinds with that prefix: [a, b)

log = logging.getLogger(__name__)

# SQLite's primary result codes for a full, read-only and failing disk, as errnos.
_SQLITE_FAULTS = {13: errno.ENOSPC, 8: errno.EROFS, 10: errno.EIO}
# Disk set aside beside the database (`<db>.reserve`) and given back when the disk is
# full, so that records can still be written while pods are stopped and removed; and
# the room a new pod or container needs before anything of it is written.
RESERVE_BYTES = 8 << 20
MIN_ROOM = 1 << 20


def _errno(e: sqlite3.Error) -> int | None:
    return _SQLITE_FAULTS.get(getattr(e, "sqlite_errorcode", 0) & 0xFF)


def _fault(e: sqlite3.Error, path: Path) -> Exception:
    """The domain error of a disk fault, else `e` itself."""
    code = _errno(e)
    fault = host_fault(OSError(code, os.strerror(code)), path) if code else None
    return fault if fault is not None else e

# How long opening waits for another holder of the database to let go.
_OPEN_WAIT = 5.0

# Each entry moves the schema from version i to i+1. Append only; never edit.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        "CREATE TABLE records (kind TEXT NOT NULL, id TEXT NOT NULL, data TEXT NOT NULL,"
        " PRIMARY KEY (kind, id))",
    ),
]


# Bounds on one stored row, checked before it is parsed: a record pycri wrote is a few
# KiB (a container's config with ten thousand env vars, a few MiB) and nests a few
# levels; a row past either was not written by pycri, and is set aside unparsed.
MAX_RECORD_BYTES = 64 << 20
MAX_RECORD_DEPTH = 32


def _decode(kind: object, rid: object, data: object) -> tuple[Record | None, str]:
    """A row as a record, or None and why not."""
    if not isinstance(kind, str) or not isinstance(rid, str):
        return None, "has a key that is not text"
    if not isinstance(data, (str, bytes)):
        return None, "is not JSON text"
    try:
        record = boundedjson.loads(data, MAX_RECORD_BYTES, MAX_RECORD_DEPTH)
    except boundedjson.BoundsError as e:
        return None, str(e)
    except ValueError as e:  # json's errors and UnicodeDecodeError
        return None, f"is {parsefail.invalid('JSON', e)}"
    if not isinstance(record, dict):
        return None, "is not a JSON object"
    return record, ""


def count_set_aside(db: sqlite3.Connection) -> dict[str, int]:
    """`set-aside:<kind>` rows by kind, counted in the file where they stay for a person
    to read (the daemon's Store, or `pycri check` reading the file itself)."""
    rows = db.execute(
        "SELECT kind, count(*) FROM records WHERE kind >= ? AND kind < ? GROUP BY kind",
        _SET_ASIDE_RANGE).fetchall()
    return {str(k).removeprefix(SET_ASIDE): int(n) for k, n in rows}


class StoreLocked(RuntimeError):
    """Another process holds the metadata database."""


class StoreDamaged(RuntimeError):
    """The metadata database cannot be read as one (moved aside at open)."""


# The row that says a damaged database was moved aside and the new one's records are
# still being rebuilt from the node: a start that finds it rebuilds (again).
REBUILD = ("rebuild", "pending")


class Store:
    """Write-through record store; safe to call from the event loop and threads.

    The database is held exclusively for the store's lifetime (SQLite's exclusive
    locking mode, taken at open): no other process can open a write transaction that
    would stall our writes (on the event loop) or have us fail them half-way. A crash,
    even inside a transaction, is recovered by the next open from the WAL.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        # Where a damaged database was moved, while its records are being rebuilt from
        # the node (pycri/rebuild.py); None once they are, and for a sound database.
        self.damaged: str | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._open()
        except StoreDamaged as e:
            try:
                aside = self._move_aside()
            except OSError as err:
                raise StoreDamaged(f"{e}, and could not be moved aside: "
                                   f"{err.strerror or err}") from None
            log.error("%s; moved it to %s and starting a new one: the records of what runs "
                      "on the node are rebuilt from disk", e, aside)
            self._open()
            self.put(REBUILD[0], REBUILD[1], {"damaged": str(aside)})
        pending = self.get(*REBUILD)
        if pending is not None:  # this start, or one a crash cut short during the rebuild
            damaged = pending.get("damaged")
            self.damaged = damaged if isinstance(damaged, str) else "?"

    def _open(self) -> None:
        path = self.path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                   timeout=_OPEN_WAIT)
        os.chmod(path, 0o600)  # container configs carry env values from Secrets
        try:
            # Before the first access, so no shared-memory index is used either.
            self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("BEGIN EXCLUSIVE")  # take the lock now, and keep it
            self._db.execute("COMMIT")
        except sqlite3.OperationalError as e:
            self._db.close()
            raise StoreLocked(
                f"metadata database {path} is in use by another process ({e}); "
                "is another pycri running with this root?"
            ) from None
        except sqlite3.DatabaseError as e:
            raise self._damaged(e) from None
        try:
            self._check()
            self._load()
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError):  # a full disk, say: as it is
                self._db.close()
                raise
            raise self._damaged(e) from None

    def _check(self) -> None:
        """SQLite's quick check, stopped at the first problem: the file's pages and
        records are sound (a torn page the WAL did not heal, a truncated file)."""
        (first,) = self._db.execute("PRAGMA quick_check(1)").fetchone()
        if first != "ok":
            raise sqlite3.DatabaseError(str(first)[:200])

    def _damaged(self, e: sqlite3.DatabaseError) -> StoreDamaged:
        """Not a database, or torn past what the WAL heals (SQLITE_NOTADB, _CORRUPT)."""
        self._db.close()
        return StoreDamaged(f"metadata database {self.path} is damaged ({e})")

    def _move_aside(self) -> Path:
        """Keep the damaged file, and its journal, for a person to read, under a dated
        name beside it; never deleted."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.path.with_name(f"{self.path.name}.damaged-{stamp}")
        n = 1
        while aside.exists():
            n += 1
            aside = self.path.with_name(f"{self.path.name}.damaged-{stamp}-{n}")
        for suffix in ("-wal", "-shm"):
            journal = Path(f"{self.path}{suffix}")
            if journal.exists():
                os.rename(journal, f"{aside}{suffix}")
        os.rename(self.path, aside)
        return aside

    def rebuilt(self) -> None:
        """The rebuild of a damaged database's records is done (pycri/rebuild.py)."""
        self.delete(*REBUILD)
        self.damaged = None

    def _load(self) -> None:
        path = self.path
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._lock = threading.Lock()
        self._reserve = path.with_name(path.name + ".reserve")
        self._make_reserve()
        self._migrate()
        self._index: dict[str, dict[str, Record]] = {}
        bad: list[tuple[Any, Any, str]] = []
        # Rows set aside stay out of memory, and are never set aside again.
        for kind, rid, data in self._db.execute(
                "SELECT kind, id, data FROM records WHERE NOT (kind >= ? AND kind < ?)",
                _SET_ASIDE_RANGE):
            record, why = _decode(kind, rid, data)
            if record is None:
                bad.append((kind, rid, why))
                continue
            self._index.setdefault(kind, {})[rid] = record
        for kind, rid, why in bad:
            # Key and reason, never the contents: a row may hold a Secret's value.
            log.error("%s record %s %s; set aside", str(kind)[:64], str(rid)[:128], why)
            self.set_aside(kind, rid)

    @property
    def schema_version(self) -> int:
        row = self._db.execute("SELECT version FROM schema_version").fetchone()
        return int(row[0])

    def _migrate(self) -> None:
        with self._lock:
            self._db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = self._db.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                self._db.execute("INSERT INTO schema_version VALUES (0)")
                current = 0
            else:
                current = int(row[0])
            if current > len(MIGRATIONS):
                raise RuntimeError(
                    f"metadata schema version {current} is newer than this pycri "
                    f"({len(MIGRATIONS)}); refusing to downgrade"
                )
            for version in range(current, len(MIGRATIONS)):
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for stmt in MIGRATIONS[version]:
                        self._db.execute(stmt)
                    self._db.execute("UPDATE schema_version SET version = ?", (version + 1,))
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise

    def _write(self, statements: Callable[[], None]) -> None:
        """Run a write, and the index change after it, under the lock (so the index
        follows the file in the order the writes were made). A full disk first releases
        the reserve and tries once more, so that stopping and removing what runs still
        works on it; a full, read-only or failing disk is then its domain error naming
        the database's filesystem (SQLite says only "database or disk is full")."""
        with self._lock:
            try:
                try:
                    statements()
                except sqlite3.Error as e:
                    if _errno(e) != errno.ENOSPC or not self._release_reserve():
                        raise
                    statements()
            except sqlite3.Error as e:
                fault = _fault(e, self.path)
                if fault is e:
                    raise
                raise fault from e
            if not self._has_reserve:
                self._make_reserve(quiet=True)

    def _make_reserve(self, quiet: bool = False) -> None:
        """Set RESERVE_BYTES of the database's filesystem aside, when it has four times
        that free (at start, and after each write until it has)."""
        try:
            st = os.statvfs(self.path.parent)
            if st.f_bavail * st.f_frsize < 4 * RESERVE_BYTES:
                raise OSError(errno.ENOSPC, "less than four times the reserve free")
            fd = os.open(self._reserve, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                self._reserve.unlink()
            self._has_reserve = False
            if not quiet:
                log.warning("no reserve for the database on %s (%s): on a full disk, pods "
                            "may not stop until there is room", filesystem(self.path),
                            e.strerror or e)
            return
        self._has_reserve = True
        if quiet:
            log.info("the database's reserve is set aside again on %s", filesystem(self.path))

    def _release_reserve(self) -> bool:
        if not self._has_reserve:
            return False
        self._has_reserve = False
        try:
            self._reserve.unlink()
        except FileNotFoundError:
            return False
        log.warning("%s is full: released the database's reserve (%d MiB) so that pods "
                    "and containers can still be stopped and removed; new ones wait for "
                    "room", filesystem(self.path), RESERVE_BYTES >> 20)
        return True

    def require_room(self) -> None:
        """A new pod or container waits for room: the last MIN_ROOM bytes of the
        database's filesystem, and the reserve, are for stopping what exists."""
        st = os.statvfs(self.path.parent)
        if st.f_bavail * st.f_frsize < MIN_ROOM:
            raise ResourceExhausted(f"no space left on {filesystem(self.path)}: new pods "
                                    f"and containers wait for {MIN_ROOM >> 20} MiB free")

    def put(self, kind: str, rid: str, record: Record) -> None:
        """Insert or replace; durable when this returns."""
        data = json.dumps(record, separators=(",", ":"), sort_keys=True)

        def write() -> None:
            self._db.execute(
                "INSERT OR REPLACE INTO records (kind, id, data) VALUES (?, ?, ?)",
                (kind, rid, data),
            )
            self._index.setdefault(kind, {})[rid] = record
        self._write(write)

    def delete(self, kind: str, rid: str) -> None:
        """Remove a record; absent is fine (callers are idempotent)."""
        def write() -> None:
            self._db.execute("DELETE FROM records WHERE kind = ? AND id = ?", (kind, rid))
            self._index.get(kind, {}).pop(rid, None)
        self._write(write)

    def set_aside(self, kind: str, rid: str) -> None:
        """Move a record its owner cannot load to kind `set-aside:<kind>`: out of every
        listing, kept in the file for a person to look at."""
        def write() -> None:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM records WHERE kind = ? AND id = ?",
                                 (f"{SET_ASIDE}{kind}", rid))
                self._db.execute("UPDATE records SET kind = ? WHERE kind = ? AND id = ?",
                                 (f"{SET_ASIDE}{kind}", kind, rid))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._index.get(kind, {}).pop(rid, None)
        self._write(write)

    def set_aside_counts(self) -> dict[str, int]:
        """How many rows of each kind are set aside (for /metrics)."""
        with self._lock:
            return count_set_aside(self._db)

    def get(self, kind: str, rid: str) -> Record | None:
        return self._index.get(kind, {}).get(rid)

    def items(self, kind: str) -> Iterator[tuple[str, Record]]:
        """A snapshot of one kind's records, safe against concurrent writes."""
        return iter(list(self._index.get(kind, {}).items()))

    def load(self, kind: str, build: Callable[[str, Record], T]) -> list[T]:
        """One kind's records as `build` makes them at start; a record it cannot make
        is logged and set aside, so one bad row never keeps the node down."""
        out = []
        for rid, rec in self.items(kind):
            try:
                out.append(build(rid, rec))
            except Exception as e:
                log.error("%s record %s is unusable (%s: %s); set aside",
                          kind, rid, type(e).__name__, e)
                self.set_aside(kind, rid)
        return out

    def close(self) -> None:
        with self._lock:
            self._db.close()
