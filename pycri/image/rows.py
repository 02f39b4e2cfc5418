"""The stored forms of images, layers and snapshots, checked field by field when the
image manager loads them (issue 38): the image package's side of the store's one door,
as `Sandbox.from_record` and `Container.from_record` are the managers'. A row that
fails names its field; `ImageManager.recover` then sets it aside and makes what it can
again from the disk (image/found.py, a layer's size counted again).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pycri.image import reference
from pycri.store import typed
from pycri.store.db import Record

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ImageRow:
    id: str
    repo_tags: list[str]
    repo_digests: list[str]
    blobs: list[str]
    chain_ids: list[str]
    config: dict[str, Any]
    size: int
    annotations: dict[str, str]


@dataclass(frozen=True)
class LayerRow:
    diff_id: str
    bytes: int
    inodes: int


@dataclass(frozen=True)
class SnapshotRow:
    image_id: str
    chain_ids: list[str]
    view: bool


def check_image(iid: str, rec: Record) -> None:
    """TypeError or ValueError naming what in image row `iid` is not as pycri writes it."""
    what = f"image {iid[:80]}"
    typed.check(ImageRow, rec, what)
    row = ImageRow(**rec)
    if row.id != iid or not reference.is_digest(iid):
        raise ValueError(f"{what}: its ID is not its key, or not a sha256 digest")
    if not all(reference.is_digest(b) for b in row.blobs):
        raise ValueError(f"{what}: field blobs holds a value that is not a sha256 digest")
    _chains(row.chain_ids, what)
    if row.size < 0:
        raise ValueError(f"{what}: field size is negative")


def check_layer(chain: str, rec: Record) -> None:
    what = f"layer {chain[:80]}"
    typed.check(LayerRow, rec, what)
    row = LayerRow(**rec)
    if row.bytes < 0 or row.inodes < 0:
        raise ValueError(f"{what}: a negative size")


def check_snapshot(key: str, rec: Record) -> None:
    what = f"snapshot {key[:80]}"
    typed.check(SnapshotRow, rec, what)
    _chains(SnapshotRow(**rec).chain_ids, what)


def _chains(chains: list[str], what: str) -> None:
    if not all(_HEX64.fullmatch(c) for c in chains):
        raise ValueError(f"{what}: field chain_ids holds a value that is not a chain ID")
