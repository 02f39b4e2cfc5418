"""A pod's or container's record as it was when its process was created, kept in the
object's bundle (`record.json`): what a damaged database is rebuilt from (pycri/rebuild.py).

The database stays the one place records are read from; this copy is written once, when
the bundle is, and read only by a rebuild. It holds what no other file on the node
says (the CRI request with its labels, attempt and log path, the image ID, the handler)
and the snapshots the object holds, by key, so that their layers are held again.
Decoded at one door: bounded, no link followed, typed, and every field of the record
checked by its own class when the rebuild builds it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pycri import boundedjson, parsefail
from pycri.store.db import Record

NAME = "record.json"
FORMAT = 1
KINDS = ("sandbox", "container")
# A container's record is its request and a few fields: a few KiB, up to a few MiB
# for ten thousand env values; a file past this was not written by pycri.
MAX_BYTES = 64 << 20
MAX_DEPTH = 32


@dataclass(frozen=True)
class Snapshot:
    """A snapshot the object holds: its image, and whether it is a read-only view."""

    image_id: str
    view: bool


@dataclass(frozen=True)
class Beside:
    kind: str
    id: str
    record: Record
    snapshots: dict[str, Snapshot]


def encode(kind: str, oid: str, record: Record, snapshots: dict[str, Snapshot]) -> bytes:
    return json.dumps({
        "format": FORMAT, "kind": kind, "id": oid, "record": record,
        "snapshots": {k: {"image_id": s.image_id, "view": s.view}
                      for k, s in snapshots.items()},
    }, separators=(",", ":"), sort_keys=True).encode()


def read(bundle: Path) -> Beside:
    """The record in `bundle`, whose name is the object's ID; ValueError saying why
    not (OSError for a file that cannot be read)."""
    data = boundedjson.read_file(bundle / NAME, MAX_BYTES)
    try:
        doc = boundedjson.loads(data, MAX_BYTES, MAX_DEPTH)
    except boundedjson.BoundsError:
        raise
    except ValueError as e:
        raise ValueError(f"is {parsefail.invalid('JSON', e)}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("has an unknown format")
    kind, oid, record, snaps = (doc.get(k) for k in ("kind", "id", "record", "snapshots"))
    if kind not in KINDS:
        raise ValueError("names no kind pycri knows")
    if oid != bundle.name:
        raise ValueError("is another object's")
    if not isinstance(record, dict) or not isinstance(snaps, dict):
        raise ValueError("holds no record")
    return Beside(kind, oid, record, {k: _snapshot(k, v) for k, v in snaps.items()})


def _snapshot(key: str, value: Any) -> Snapshot:
    if not isinstance(value, dict) or not isinstance(value.get("image_id"), str) \
            or not isinstance(value.get("view"), bool):
        raise ValueError(f"has a damaged snapshot entry {key[:80]!r}")
    return Snapshot(value["image_id"], value["view"])
