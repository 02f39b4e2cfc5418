"""ItemCache: a message is reused until its record's revision changes."""

from __future__ import annotations

from dataclasses import dataclass

from pycri.server.itemcache import ItemCache


@dataclass
class Rec:
    id: str
    revision: int = 0


def test_reuse_until_revision_changes_and_prune() -> None:
    built: list[str] = []

    def build(r: Rec) -> str:
        built.append(r.id)
        return f"{r.id}@{r.revision}"

    cache: ItemCache[Rec, str] = ItemCache(build)
    a, b = Rec("a"), Rec("b")
    assert cache.all([a, b], complete=True) == ["a@0", "b@0"]
    assert cache.all([a, b], complete=True) == ["a@0", "b@0"]
    assert built == ["a", "b"]
    a.revision += 1
    assert cache.get(a) == "a@1"
    assert built == ["a", "b", "a"]
    assert cache.all([a], complete=False) == ["a@1"]  # a filtered list keeps b cached
    assert cache.get(b) == "b@0" and len(built) == 3
    cache.all([a], complete=True)  # b is gone for good
    assert cache.get(b) == "b@0" and len(built) == 4
