"""pycri/beneath.py: files made in directories others made, no link followed beneath."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pycri import beneath


def test_a_file_is_made_with_its_final_mode_and_its_directories(tmp_path: Path) -> None:
    assert beneath.ensure_file(tmp_path, "ctr/0.log", 0o640, make_dirs=0o755)
    f = tmp_path / "ctr" / "0.log"
    assert stat.S_IMODE(f.stat().st_mode) == 0o640 and f.read_bytes() == b""
    f.write_bytes(b"kept")
    assert not beneath.ensure_file(tmp_path, "ctr/0.log", 0o640)  # there: kept as it is
    assert f.read_bytes() == b"kept"
    beneath.remove(tmp_path, "ctr/0.log")
    beneath.remove(tmp_path, "ctr/0.log")  # gone is fine
    assert not f.exists()


def test_a_planted_link_is_refused_and_nothing_is_written_outside(tmp_path: Path) -> None:
    """Issue 41: a log file that was a link to a root-owned file outside the log dir got
    the container's output; a linked directory had files made through it."""
    logs, outside = tmp_path / "logs", tmp_path / "outside"
    logs.mkdir()
    outside.mkdir()
    secret = outside / "shadow"
    secret.write_bytes(b"root:x")
    (logs / "0.log").symlink_to(secret)
    with pytest.raises(OSError, match="is a symbolic link"):
        beneath.ensure_file(logs, "0.log", 0o640)
    (logs / "ctr").symlink_to(outside)
    for rel in ("ctr/0.log", "ctr/deeper/0.log"):
        with pytest.raises(OSError, match="is a symbolic link") as e:
            beneath.ensure_file(logs, rel, 0o640, make_dirs=0o755)
        assert e.value.filename == "ctr"
    with pytest.raises(OSError, match="is a symbolic link"):
        beneath.remove(logs, "ctr/shadow")
    assert sorted(os.listdir(outside)) == ["shadow"] and secret.read_bytes() == b"root:x"
    with pytest.raises(OSError, match="is a symbolic link"):
        beneath.refuse_link(logs, "0.log")
    beneath.refuse_link(logs, "absent.log")


def test_what_is_not_a_regular_file_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.log")  # opened for writing with no reader: refused at once
    with pytest.raises(OSError):
        beneath.ensure_file(tmp_path, "fifo.log", 0o640)
    (tmp_path / "dir.log").mkdir()
    with pytest.raises(OSError, match="directory"):
        beneath.ensure_file(tmp_path, "dir.log", 0o640)


@pytest.mark.parametrize("rel", ["", "/etc/x", "../x", "a/../x", "a/./x"])
def test_only_plain_relative_paths(tmp_path: Path, rel: str) -> None:
    with pytest.raises(OSError, match="not a plain relative path"):
        beneath.ensure_file(tmp_path, rel, 0o640)
