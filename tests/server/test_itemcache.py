"""ItemCache: a message is reused until its record's revision changes."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import pytest

from pycri.server.itemcache import ItemCache


@dataclass(eq=False)
class Rec:
    id: str
    revision: int = 0


def test_reuse_until_revision_changes() -> None:
    built: list[str] = []

    def build(r: Rec) -> str:
        built.append(r.id)
        return f"{r.id}@{r.revision}"

    cache: ItemCache[Rec, str] = ItemCache(build)
    a, b = Rec("a"), Rec("b")
    assert cache.all([a, b]) == ["a@0", "b@0"]
    assert cache.all([a, b]) == ["a@0", "b@0"]
    assert built == ["a", "b"]
    a.revision += 1
    assert cache.get(a) == "a@1"
    assert built == ["a", "b", "a"]


def test_entries_go_with_their_records() -> None:
    cache: ItemCache[Rec, str] = ItemCache(lambda r: r.id)
    records = [Rec(str(i)) for i in range(10)]
    cache.all(records)
    assert len(cache) == 10
    del records[:5]
    gc.collect()
    assert len(cache) == 5


def test_a_record_that_cannot_be_built_is_left_out_of_lists(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def build(r: Rec) -> str:
        if r.id == "bad":
            raise TypeError("created_at must be an int")
        return r.id

    cache: ItemCache[Rec, str] = ItemCache(build)
    records = [Rec("a"), Rec("bad"), Rec("b")]
    assert cache.all(records) == ["a", "b"]
    assert cache.all(records) == ["a", "b"]
    assert [r.message for r in caplog.records].count(
        "record bad left out of lists: its message cannot be built") == 1  # once per revision
