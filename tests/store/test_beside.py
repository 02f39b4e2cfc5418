"""The record kept in a bundle (store/beside.py) is read at one door: bounded, regular
files only, no link followed, never blocking, typed; a bad one says why in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pycri import boundedjson
from pycri.store import beside
from pycri.store.beside import Snapshot

OID = "a" * 64


def _bundle(tmp_path: Path, data: bytes | None = None) -> Path:
    bundle = tmp_path / OID
    bundle.mkdir()
    if data is not None:
        (bundle / beside.NAME).write_bytes(data)
    return bundle


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    snaps = {OID: Snapshot("sha256:" + "b" * 64, view=False),
             f"{OID}-vol0": Snapshot("sha256:" + "c" * 64, view=True)}
    data = beside.encode("container", OID, {"handler": "runc", "env": ["K=v"]}, snaps)
    found = beside.read(_bundle(tmp_path, data))
    assert (found.kind, found.id, found.record, found.snapshots) == (
        "container", OID, {"handler": "runc", "env": ["K=v"]}, snaps)


def _doc(**kw: object) -> bytes:
    doc = {"format": 1, "kind": "sandbox", "id": OID, "record": {}, "snapshots": {}}
    return json.dumps({**doc, **kw}).encode()


@pytest.mark.parametrize(("data", "why"), [
    (b'{"format": 1', "is not valid JSON"),
    (b"\xff\xfe", "is not valid UTF-8"),
    (b"[" * 100 + b"]" * 100, "nests deeper than 32 levels"),
    (b"[1]", "has an unknown format"),
    (_doc(format=2), "has an unknown format"),
    (_doc(kind="image"), "names no kind pycri knows"),
    (_doc(id="b" * 64), "is another object's"),
    (_doc(record=[]), "holds no record"),
    (_doc(snapshots={OID: {"image_id": 1, "view": False}}), "has a damaged snapshot entry"),
    (_doc(snapshots={OID: {"image_id": "x", "view": "no"}}), "has a damaged snapshot entry"),
])
def test_a_damaged_record_says_why(tmp_path: Path, data: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        beside.read(_bundle(tmp_path, data))


def test_only_a_bounded_regular_file_is_read(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    with pytest.raises(FileNotFoundError):
        beside.read(bundle)
    os.mkfifo(bundle / beside.NAME)  # an open that blocked would hang the start
    with pytest.raises(OSError, match="not a regular file"):
        beside.read(bundle)
    (bundle / beside.NAME).unlink()
    (tmp_path / "elsewhere").write_bytes(_doc())
    (bundle / beside.NAME).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):  # ELOOP: never followed
        beside.read(bundle)
    (bundle / beside.NAME).unlink()
    with (bundle / beside.NAME).open("wb") as f:
        f.truncate(beside.MAX_BYTES + 1)
    with pytest.raises(OSError, match="larger than"):
        beside.read(bundle)
    assert issubclass(boundedjson.BoundsError, ValueError)
