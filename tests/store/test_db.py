"""Metadata store: write-through, survives reopen, migrations recorded."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from pycri.store import Store
from pycri.store.db import MIGRATIONS, StoreLocked


def test_records_survive_reopen(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    s = Store(db)
    s.put("sandbox", "a", {"name": "a", "n": 1})
    s.put("sandbox", "b", {"name": "b"})
    s.put("container", "c", {"sandbox": "a"})
    s.delete("sandbox", "b")
    s.delete("sandbox", "absent")  # idempotent
    s.close()
    s2 = Store(db)
    assert dict(s2.items("sandbox")) == {"a": {"name": "a", "n": 1}}
    assert s2.get("container", "c") == {"sandbox": "a"}
    assert s2.get("image", "x") is None
    assert s2.schema_version == len(MIGRATIONS)
    s2.close()


def test_wal_mode(tmp_path: Path) -> None:
    s = Store(tmp_path / "m.db")
    s.put("k", "i", {})
    s.close()
    mode = sqlite3.connect(tmp_path / "m.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_database_is_held_exclusively(tmp_path: Path) -> None:
    """No other process can write (or stall our writes) while the store is open."""
    s = Store(tmp_path / "m.db")
    other = sqlite3.connect(tmp_path / "m.db", timeout=0.1, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        other.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreLocked, match="in use by another process"):
        Store(tmp_path / "m.db")
    s.put("k", "i", {"still": "writable"})
    s.close()
    other.execute("BEGIN IMMEDIATE")  # released on close
    other.execute("ROLLBACK")
    other.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    Store(db).close()
    con = sqlite3.connect(db)
    con.execute("UPDATE schema_version SET version = 999")
    con.commit()
    con.close()
    with pytest.raises(RuntimeError, match="newer than this pycri"):
        Store(db)


def test_items_is_a_snapshot(tmp_path: Path) -> None:
    s = Store(tmp_path / "m.db")
    for i in range(3):
        s.put("k", str(i), {"i": i})
    for rid, _ in s.items("k"):
        s.delete("k", rid)  # deleting while iterating must not break the loop
    assert list(s.items("k")) == []
    s.close()


def test_db_file_is_private(tmp_path: Path) -> None:
    Store(tmp_path / "m.db").close()
    assert (tmp_path / "m.db").stat().st_mode & 0o777 == 0o600


def test_a_row_that_is_not_a_json_object_is_set_aside(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    first = Store(db)
    first.put("sandbox", "good", {"name": "g"})
    first.close()
    conn = sqlite3.connect(db)
    with conn:
        conn.executemany("INSERT INTO records (kind, id, data) VALUES ('sandbox', ?, ?)",
                         [("torn", '{"name": '), ("list", "[1]")])
    conn.close()
    s = Store(db)
    assert dict(s.items("sandbox")) == {"good": {"name": "g"}}
    s.set_aside("sandbox", "good")
    assert dict(s.items("sandbox")) == {}
    s.close()
    with sqlite3.connect(db) as conn:
        kinds = sorted(conn.execute("SELECT kind, id FROM records").fetchall())
    assert kinds == [("set-aside:sandbox", "good"), ("set-aside:sandbox", "list"),
                     ("set-aside:sandbox", "torn")]


def test_a_full_database_is_resource_exhausted_naming_its_filesystem(tmp_path: Path) -> None:
    from pycri.errors import ResourceExhausted, filesystem

    s = Store(tmp_path / "pycri.db")
    s.put("sandbox", "small", {"n": 1})
    pages = s._db.execute("PRAGMA page_count").fetchone()[0]
    s._db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own SQLITE_FULL
    with pytest.raises(ResourceExhausted) as e:
        s.put("sandbox", "big", {"blob": "x" * 100_000})
    assert str(e.value) == f"no space left on {filesystem(tmp_path)}"
    assert s.get("sandbox", "big") is None  # nothing half-written, in memory or on disk
    s.close()
    assert [i for i, _ in Store(tmp_path / "pycri.db").items("sandbox")] == ["small"]


def test_hostile_rows_are_set_aside_and_the_store_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Issue 38: one row nested 100,000 deep kept the daemon from starting (a
    RecursionError in the parser). Every row is bounded before it is parsed; a bad one
    is set aside with its key and reason in the log, never its contents."""
    import logging

    from pycri.store import db as store_db

    monkeypatch.setattr(store_db, "MAX_RECORD_BYTES", 300_000)
    path = tmp_path / "m.db"
    first = Store(path)
    first.put("sandbox", "good", {"name": "g"})
    first.close()
    secret = "SECRET-VALUE"
    rows = [
        ("sandbox", "deep", "[" * 100_000 + f'"{secret}"' + "]" * 100_000),
        ("sandbox", "huge", json.dumps({"v": secret * 30_000})),
        ("sandbox", "number", 7),
        ("sandbox", "bytes", b'{"a": "\xff\xfe"}'),
        ("sandbox", b"\xff\x00", '{"a": 1}'),  # a BLOB key (TEXT affinity keeps it)
        (b"\xfe", "kind", '{"a": 1}'),
        ("sandbox", "strings-deep", json.dumps({"v": "[" * 1000})),  # not nesting
    ]
    conn = sqlite3.connect(path)
    with conn:
        conn.executemany("INSERT INTO records (kind, id, data) VALUES (?, ?, ?)", rows)
    conn.close()
    with caplog.at_level(logging.ERROR, logger="pycri.store.db"):
        s = Store(path)
    assert dict(s.items("sandbox")) == {"good": {"name": "g"},
                                        "strings-deep": {"v": "[" * 1000}}
    s.close()
    conn = sqlite3.connect(path)
    aside = sorted((str(k), str(i)) for k, i in conn.execute(
        "SELECT kind, id FROM records WHERE kind LIKE 'set-aside:%'"))
    conn.close()
    assert aside == [("set-aside:b'\\xfe'", "kind"), ("set-aside:sandbox", "b'\\xff\\x00'"),
                     ("set-aside:sandbox", "bytes"), ("set-aside:sandbox", "deep"),
                     ("set-aside:sandbox", "huge"), ("set-aside:sandbox", "number")]
    # Opened again: the rows set aside stay as they are, out of memory, counted.
    again = Store(path)
    assert again.set_aside_counts() == {"sandbox": 5, "b'\\xfe'": 1}
    assert not list(again.items("set-aside:sandbox"))
    again.close()
    conn = sqlite3.connect(path)
    assert sorted((str(k), str(i)) for k, i in conn.execute(
        "SELECT kind, id FROM records WHERE kind LIKE 'set-aside:%'")) == aside
    conn.close()
    text = caplog.text
    assert "sandbox record deep nests deeper than 32 levels; set aside" in text
    assert "sandbox record huge is larger than 300000 bytes; set aside" in text
    assert "sandbox record number is not a JSON object; set aside" in text  # TEXT affinity
    assert "sandbox record bytes is not valid UTF-8" in text
    assert "has a key that is not text; set aside" in text
    assert secret not in text


def _torn_page(data: bytes) -> bytes:
    """A page in the middle of the file overwritten (a torn write the WAL cannot heal):
    the file still opens, and only the quick check finds it."""
    page = 4096
    middle = len(data) // page // 2 * page
    return data[:middle] + b"\xa5" * page + data[middle + page:]


DAMAGE = {
    "truncated": lambda data: data[: len(data) // 3],
    "garbage": lambda data: b"\x00garbage" * 512,
    "torn-page": _torn_page,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_database_is_moved_aside_and_a_new_one_started(tmp_path: Path,
                                                                 damage: str) -> None:
    """Issue 38: a truncated database file was a traceback at start, and no start. It
    is moved aside under a dated name (never deleted), a new one is made, and the store
    says a rebuild is due (pycri/rebuild.py) until it is told it is done; a crash
    during the rebuild leaves that said for the next start."""
    db = tmp_path / "pycri.db"
    s = Store(db)
    for i in range(300):
        s.put("sandbox", f"id{i}", {"x": "y" * 300})
    s.close()
    db.write_bytes(DAMAGE[damage](db.read_bytes()))
    before = db.read_bytes()
    s = Store(db)
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("pycri.db.damaged-")]
    assert re.fullmatch(r"pycri\.db\.damaged-\d{8}T\d{6}Z", aside.name)
    assert aside.read_bytes() == before  # kept for a person to read
    assert s.damaged == str(aside)
    assert list(s.items("sandbox")) == []
    s.put("sandbox", "rebuilt", {"x": "y"})
    s.close()  # a crash before the rebuild said it was done
    s = Store(db)
    assert s.damaged == str(aside) and s.get("sandbox", "rebuilt") == {"x": "y"}
    s.rebuilt()
    s.close()
    s = Store(db)
    assert s.damaged is None and s.get("sandbox", "rebuilt") == {"x": "y"}
    s.close()
    assert len([p for p in tmp_path.iterdir() if ".damaged-" in p.name]) == 1
