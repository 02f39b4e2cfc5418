"""The host side of user namespaces, on real mounts: the start-up probe (an idmapped
layer under a real overlay), its refusal of a rootfs area others cannot search, and a
pinned user namespace that idmapped copies are staged with and unstaged again."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycri.check import run_checks
from pycri.config import Config, RuntimeHandler
from pycri.image.snapshots import Snapshotter
from pycri.network.netns import remove_netns
from pycri.oci import mounts
from pycri.oci.spec.namespaces import IDMap
from pycri.oci.userns import create_pod_namespaces, open_userns, probe_kernel, unpin_userns


@pytest.fixture
def area() -> Iterator[Path]:
    base = Path("/var/tmp") / f"pycri-userns-host-{secrets.token_hex(4)}"
    base.mkdir(mode=0o711)
    (base / "store" / "empty").mkdir(parents=True)
    (base / "rootfs").mkdir(mode=0o711)
    yield base
    with open("/proc/mounts") as f:
        assert not [line for line in f if str(base) in line]
    for p in sorted(base.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    base.rmdir()


def test_probe_passes_here_and_leaves_nothing(area: Path) -> None:
    assert probe_kernel(area / "store", area / "rootfs") is None
    assert not list((area / "rootfs").iterdir())
    # A probe cut short (overlay's work/work left behind) does not block the next one.
    (area / "rootfs" / ".probe-userns" / "work" / "work").mkdir(parents=True, mode=0o700)
    assert probe_kernel(area / "store", area / "rootfs") is None
    assert not list((area / "rootfs").iterdir())


def test_probe_refuses_an_area_others_cannot_search(area: Path) -> None:
    os.chmod(area, 0o700)
    try:
        problem = probe_kernel(area / "store", area / "rootfs")
    finally:
        os.chmod(area, 0o711)
    assert problem is not None and "is not searchable by other users" in problem


def test_pinned_namespace_stages_idmapped_copies(area: Path) -> None:
    src = area / "store" / "data"
    src.mkdir()
    (src / "f").write_text("x")
    pin = area / "userns"
    name = f"pycri-test-{secrets.token_hex(4)}"
    maps = (IDMap(0, 65536 * 40, 65536),)
    netns = asyncio.run(create_pod_namespaces(pin, name, maps, maps))
    try:
        assert Path(netns).exists()
        target = area / "staged" / "0"
        fd = open_userns(pin)
        try:
            mounts.stage_idmapped(str(src), target, fd, readonly=True)
        finally:
            os.close(fd)
        assert os.stat(target / "f").st_uid == 65536 * 40  # host root's file, as seen mapped
        with pytest.raises(OSError):
            (target / "g").write_text("read-only")
        mounts.unstage_all(area / "staged")
        assert not (area / "staged").exists()
    finally:
        unpin_userns(pin)
        asyncio.run(remove_netns(netns))
    assert not pin.exists() and not Path(netns).exists()


def test_pycri_check_reports_user_namespaces_by_handler(area: Path) -> None:
    cfg = Config(root=str(area / "store"), state=str(area))
    cfg.runtimes["old"] = RuntimeHandler(path=str(area / "old-runtime"))
    (area / "old-runtime").write_text("#!/bin/sh\necho 'runc version 1.0.2'\n")
    os.chmod(area / "old-runtime", 0o755)
    try:
        found = {c.name: c for c in run_checks(cfg) if c.name.startswith("user namespaces")}
    finally:
        (area / "old-runtime").unlink()
    assert found["user namespaces (runc)"].ok and found["user namespaces (crun)"].ok
    assert not found["user namespaces (old)"].ok
    assert found["user namespaces (old)"].detail == "runc 1.0 is older than 1.1"


def test_removing_a_snapshot_never_deletes_through_a_left_idmapped_store(area: Path) -> None:
    """A crash between staging the idmapped copy of the store and detaching it leaves the
    copy mounted in the snapshot's dir; removal must detach it before deleting the dir."""
    store = area / "store"
    snaps = Snapshotter(store / "snapshots", store / "layers", store / "l", store / "empty")
    (store / "layers" / "abc").mkdir()
    (store / "layers" / "abc" / "file").write_text("layer")
    pin = area / "userns"
    name = f"pycri-test-{secrets.token_hex(4)}"
    maps = (IDMap(0, 65536 * 41, 65536),)
    netns = asyncio.run(create_pod_namespaces(pin, name, maps, maps))
    try:
        snaps.dir("k").mkdir()
        fd = open_userns(pin)
        try:
            mounts.stage_idmapped(str(store), snaps.dir("k") / "idmapped-store", fd,
                                  readonly=True, recursive=False)
        finally:
            os.close(fd)
        asyncio.run(snaps.remove("k"))
        assert not snaps.dir("k").exists()
        assert (store / "layers" / "abc" / "file").read_text() == "layer"
    finally:
        unpin_userns(pin)
        asyncio.run(remove_netns(netns))
