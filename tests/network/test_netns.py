"""Pinned network namespaces: real unshare + bind mount under a temporary run dir."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pycri.errors import AlreadyExists, InvalidArgument
from pycri.network import create_netns, list_netns, remove_netns
from tests.network.helpers import TAG, in_netns, run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def _is_mountpoint(p: Path) -> bool:
    return any(line.split()[4] == str(p) for line in Path("/proc/self/mountinfo").read_text()
               .splitlines())


@pytest.fixture
async def run_dir(tmp_path: Path) -> AsyncIterator[Path]:
    d = tmp_path / "netns"
    try:
        yield d
    finally:
        for name in list_netns(d):
            await remove_netns(d / name)
        if _is_mountpoint(d):
            run("umount", "-l", str(d))


async def test_create_pins_a_new_namespace(run_dir: Path) -> None:
    host_ino = os.stat("/proc/thread-self/ns/net").st_ino
    path = await create_netns("a", run_dir)
    assert path == run_dir / "a"
    assert _is_mountpoint(path)
    assert os.stat(path).st_ino != host_ino
    # The calling thread stays in the host namespace.
    assert os.stat("/proc/thread-self/ns/net").st_ino == host_ino
    # A fresh netns holds only a down loopback.
    out = in_netns(path, "ip", "-o", "link", "show").stdout
    assert len(out.splitlines()) == 1 and "lo:" in out
    assert list_netns(run_dir) == ["a"]


async def test_two_namespaces_differ_and_remove_is_idempotent(run_dir: Path) -> None:
    a = await create_netns("a", run_dir)
    b = await create_netns("b", run_dir)
    assert os.stat(a).st_ino != os.stat(b).st_ino
    await remove_netns(a)
    assert not a.exists() and not _is_mountpoint(a)
    await remove_netns(a)  # already gone: success
    assert list_netns(run_dir) == ["b"]


async def test_existing_name_is_refused_and_kept(run_dir: Path) -> None:
    a = await create_netns("a", run_dir)
    ino = os.stat(a).st_ino
    with pytest.raises(AlreadyExists):
        await create_netns("a", run_dir)
    assert os.stat(a).st_ino == ino and _is_mountpoint(a)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "x" * 256])
async def test_bad_names_change_nothing(run_dir: Path, name: str) -> None:
    with pytest.raises(InvalidArgument):
        await create_netns(name, run_dir)
    assert list_netns(run_dir) == []


async def test_default_run_dir_is_ip_netns_compatible() -> None:
    name = f"pcritest{TAG}-ipnetns"
    path = await create_netns(name)
    try:
        assert path == Path("/run/netns") / name
        assert name in run("ip", "netns", "list")
        assert "lo" in run("ip", "netns", "exec", name, "ip", "-o", "link")
    finally:
        await remove_netns(path)
    assert name not in list_netns()
    assert name not in run("ip", "netns", "list")


async def test_remove_of_half_made_pin(run_dir: Path) -> None:
    """A crash between creating the pin file and mounting it leaves a plain file."""
    run_dir.mkdir()
    (run_dir / "stale").touch()
    await remove_netns(run_dir / "stale")
    assert list_netns(run_dir) == []
