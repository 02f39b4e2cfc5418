"""pycri/cadvisor/door.py without a daemon: the spec read and cAdvisor's default path."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pycri.cadvisor.door import EMPTY_SPEC, MAX_SPEC, claim_default, read_spec, release_default
from tests.cadvisor.client import CadvisorClient
from tests.conftest import PycriProcess


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
    claim = claim_default(default, door)  # nothing there: linked, its directory made
    assert claim is not None and claim.made_dir == default.parent
    assert os.readlink(default) == str(door)
    again = claim_default(default, door)  # our own link (a restart): kept
    assert again is not None and again.made_dir is None
    release_default(claim)
    assert not default.parent.exists()  # the link and the directory made for it
    default.parent.mkdir(parents=True)

    live = socket.socket(socket.AF_UNIX)
    live.bind(str(default))
    live.listen()
    try:
        assert claim_default(default, door) is None  # a containerd serves it
        assert not os.path.islink(default)
    finally:
        live.close()
    claim = claim_default(default, door)  # the same socket, dead: replaced
    assert claim is not None and claim.made_dir is None
    assert os.readlink(default) == str(door)
    release_default(claim)
    assert default.parent.is_dir() and not os.path.lexists(default)  # a dir it found stays

    default.write_text("not a socket")
    assert claim_default(default, door) is None
    assert default.read_text() == "not a socket"


def test_release_leaves_a_link_someone_else_changed(tmp_path: Path) -> None:
    door, default = tmp_path / "door.sock", tmp_path / "run" / "containerd.sock"
    claim = claim_default(default, door)
    assert claim is not None
    os.unlink(default)
    default.symlink_to(tmp_path / "elsewhere.sock")  # a containerd's start, say
    release_default(claim)
    assert os.readlink(default) == str(tmp_path / "elsewhere.sock")


def test_the_daemon_links_the_default_path_while_it_runs(pycri_dirs: PycriProcess) -> None:
    default = pycri_dirs.config.parent / "run" / "containerd" / "containerd.sock"
    text = pycri_dirs.config.read_text()
    pycri_dirs.config.write_text(text.replace('[cadvisor]\ndefault_path = ""',
                                              f'[cadvisor]\ndefault_path = "{default}"'))
    door = pycri_dirs.state / "cadvisor" / "containerd.sock"
    pycri_dirs.start()
    try:
        assert os.readlink(default) == str(door)
        client = CadvisorClient(default)  # what a kubelet with default flags dials
        try:
            assert client.version().startswith("pycri-")
        finally:
            client.close()
    finally:
        assert pycri_dirs.stop() == 0, pycri_dirs.log_text()
    assert not default.parent.exists() and not door.exists()
