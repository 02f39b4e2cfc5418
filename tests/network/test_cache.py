"""network/cache.py: the CNI cache is read at one door: a regular file, bounded, JSON of
pycri's format, or CorruptEntry naming the file and never quoting it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pycri.network.cache import FORMAT, MAX_ENTRY, CorruptEntry, ResultCache

SID = "a" * 64


@pytest.fixture
def cache(tmp_path: Path) -> ResultCache:
    (tmp_path / SID).mkdir()
    return ResultCache(tmp_path)


def test_a_good_entry_is_read(cache: ResultCache) -> None:
    (cache.root / SID / "net.json").write_text(json.dumps({"format": FORMAT, "seq": 1}))
    assert cache.read_all(SID) == [{"format": FORMAT, "seq": 1}]


@pytest.mark.parametrize("make", ["fifo", "directory", "huge", "link", "secret-json"])
def test_what_is_not_an_entry_is_corrupt_without_blocking_or_quoting(
        cache: ResultCache, tmp_path: Path, make: str) -> None:  # fmt: skip
    f = cache.root / SID / "net.json"
    if make == "fifo":
        os.mkfifo(f)
    elif make == "directory":
        f.mkdir()
    elif make == "huge":
        f.write_bytes(b" " * (MAX_ENTRY + 1))
    elif make == "link":
        target = tmp_path / "elsewhere.json"
        target.write_text(json.dumps({"format": FORMAT, "seq": 1}))
        f.symlink_to(target)  # the cache is pycri's: a link in it is not its own
    else:
        f.write_text('{"format": "root:SECRET-HASH:19000:0:99999:7:::"')
    with pytest.raises(CorruptEntry) as e:
        cache.read_all(SID)
    assert str(f) in str(e.value) and "SECRET" not in str(e.value)


def test_a_file_where_the_sandbox_directory_belongs_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / SID).write_text("not a directory")
    with pytest.raises(CorruptEntry, match="unreadable"):
        ResultCache(tmp_path).read_all(SID)
