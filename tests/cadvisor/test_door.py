"""pycri/cadvisor/door.py without a daemon: the spec read and cAdvisor's default path."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pycri.cadvisor.door import EMPTY_SPEC, MAX_SPEC, claim_default, read_spec, release_default


def test_read_spec_takes_only_a_bounded_regular_file(tmp_path: Path) -> None:
    good = tmp_path / "config.json"
    good.write_text('{"ociVersion": "1.2.0"}')
    assert read_spec(good) == b'{"ociVersion": "1.2.0"}'
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_SPEC + 1))
    link = tmp_path / "link.json"
    link.symlink_to(good)  # never followed: the bundle is pycri's, a link is not
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # would block an open without O_NONBLOCK
    for path in (big, link, fifo, tmp_path / "missing.json", tmp_path):
        assert read_spec(path) == EMPTY_SPEC, path


def test_the_default_path_is_taken_only_when_no_one_serves_it(tmp_path: Path) -> None:
    door = tmp_path / "cadvisor" / "containerd.sock"
    default = tmp_path / "run" / "containerd" / "containerd.sock"
    assert claim_default(default, door)  # nothing there: linked, parent made
    assert os.readlink(default) == str(door)
    assert claim_default(default, door)  # our own link (a restart): kept
    release_default(default, door)
    assert not os.path.lexists(default)

    live = socket.socket(socket.AF_UNIX)
    live.bind(str(default))
    live.listen()
    try:
        assert not claim_default(default, door)  # a containerd serves it
        assert not os.path.islink(default)
    finally:
        live.close()
    assert claim_default(default, door)  # the same socket, dead: replaced
    assert os.readlink(default) == str(door)

    os.unlink(default)
    default.write_text("not a socket")
    assert not claim_default(default, door)
    assert default.read_text() == "not a socket"
    release_default(default, door)  # not ours: left alone
    assert default.read_text() == "not a socket"


def test_release_leaves_a_link_someone_else_changed(tmp_path: Path) -> None:
    door, default = tmp_path / "door.sock", tmp_path / "containerd.sock"
    assert claim_default(default, door)
    os.unlink(default)
    default.symlink_to(tmp_path / "elsewhere.sock")
    release_default(default, door)
    assert os.readlink(default) == str(tmp_path / "elsewhere.sock")
