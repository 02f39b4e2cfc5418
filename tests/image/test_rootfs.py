"""Overlay root filesystems, remove semantics, shared layers, restart and recovery."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from pycri.image.manager import IMAGE, LAYER, SNAPSHOT
from pycri.image.snapshots import is_mounted
from tests.image.conftest import Maker
from tests.lib import images
from tests.lib.registry import Registry


async def test_overlay_shows_whiteouts_and_opaque_dirs(make_manager: Maker,
                                                       refs: dict[str, str]) -> None:
    m = make_manager()
    iid = await m.pull(refs["busybox"])
    root = await m.prepare_rootfs("c1", iid)
    assert is_mounted(root)
    assert not (root / "etc/removed").exists()  # whited out by layer 3
    assert sorted(os.listdir(root / "data")) == ["new"]  # opaque: layer 1/2 entries hidden
    assert os.readlink(root / "bin/sh") == "busybox"
    assert os.path.exists(root / "bin/sleep")
    assert (root / "etc/motd.link").stat().st_ino == (root / "etc/motd").stat().st_ino
    assert (root / "home/user1/hello").stat().st_uid == 1000
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o1777
    assert m.rootfs_usage("c1") == (0, 0)
    (root / "tmp/big").write_bytes(b"x" * 100_000)
    used, inodes = m.rootfs_usage("c1")
    assert used >= 100_000 and inodes >= 2  # tmp (copied up) + the file
    assert (await m.container_fs_info()).used_bytes >= 100_000
    # Writes go to the upper dir only: the shared layer is untouched.
    assert not any((m.root / "layers" / c / "tmp/big").exists()
                   for c in m._store.get(IMAGE, iid)["chain_ids"])  # type: ignore[index]
    await m.remove_rootfs("c1")
    assert not is_mounted(root) and not root.exists()
    assert m._store.get(SNAPSHOT, "c1") is None
    await m.remove_rootfs("c1")  # absent: success


async def test_empty_image_and_many_layers(make_manager: Maker, refs: dict[str, str],
                                           registry: Registry, tmp_path: Path) -> None:
    m = make_manager()
    root = await m.prepare_rootfs("e", await m.pull(refs["empty"]))
    assert is_mounted(root) and os.listdir(root) == []
    # 70 layers: absolute lowerdir paths exceed a page, so the short relative form is used.
    layers = [[images.file(f"f{i}", str(i))] for i in range(70)]
    ref = images.push_image(registry.addr, tmp_path / "layout", "many", "v1",
                            [images.ImageSpec(layers=layers)])
    root = await m.prepare_rootfs("many", await m.pull(ref))
    assert sorted(os.listdir(root)) == sorted(f"f{i}" for i in range(70))
    assert (root / "f0").read_text() == "0" and (root / "f69").read_text() == "69"
    await m.remove_rootfs("many")
    assert not is_mounted(root)


async def test_remove_by_tag_id_digest_and_shared_layers(make_manager: Maker,
                                                         refs: dict[str, str]) -> None:
    m = make_manager()
    iid = await m.pull(refs["busybox"])
    assert await m.pull(refs["library"]) == iid  # same image, a second tag
    img = m.status(iid)
    assert img is not None and len(img.repo_tags) == 2
    await m.remove(refs["busybox"])  # by tag: the whole image, all tags
    assert m.status(iid) is None and m.status(refs["library"]) is None
    assert list(m.content.digests()) == [] and list((m.root / "layers").iterdir()) == []
    await m.reaped()  # its files went after the call: now they are gone from the disk
    assert list((m.root / "tmp").iterdir()) == []
    await m.remove(refs["busybox"])  # absent: success
    await m.remove("sha256:" + "f" * 64)
    iid = await m.pull(refs["busybox"])
    await m.remove(iid[7:])  # by full hex id
    assert m.list() == []
    iid = await m.pull(refs["busybox"])
    await m.remove(m.status(iid).repo_digests[0])  # type: ignore[union-attr]
    assert m.list() == []
    # Two images sharing their base layers: removing one keeps what the other uses.
    a = await m.pull(refs["busybox"])
    b = await m.pull(refs["uid"])
    assert a != b
    shared = set(m._store.get(IMAGE, a)["chain_ids"]) & set(m._store.get(IMAGE, b)["chain_ids"])  # type: ignore[index]
    assert shared
    await m.remove(a)
    assert all(m._store.get(LAYER, c) for c in shared)
    root = await m.prepare_rootfs("b", b)
    assert (root / "bin/busybox").exists()


async def test_tag_moves_to_new_image(make_manager: Maker, registry: Registry,
                                      tmp_path: Path) -> None:
    m = make_manager()
    layout = tmp_path / "layout"
    ref = images.push_busybox(registry.addr, layout, name="moving", tag="v")
    old = await m.pull(ref)
    images.push_busybox(registry.addr, layout, name="moving", tag="v", user="1001")
    new = await m.pull(ref)
    assert new != old
    o, n = m.status(old), m.status(new)
    assert o is not None and n is not None
    assert o.repo_tags == [] and len(o.repo_digests) == 1  # keeps its digest name
    assert n.repo_tags == [ref] and m.status(ref) == n


async def test_image_in_use_keeps_layers_until_container_gone(make_manager: Maker,
                                                              refs: dict[str, str]) -> None:
    m = make_manager()
    iid = await m.pull(refs["busybox"])
    root = await m.prepare_rootfs("c1", iid)
    await m.remove(iid)
    assert m.status(iid) is None
    assert (root / "bin/busybox").exists()  # layers still there
    chains = m._store.get(SNAPSHOT, "c1")["chain_ids"]  # type: ignore[index]
    assert all((m.root / "layers" / c).is_dir() for c in chains)
    await m.remove_rootfs("c1")
    assert not any((m.root / "layers" / c).exists() for c in chains)
    assert list(m.content.digests()) == []


async def test_restart_keeps_index_and_recover_cleans(make_manager: Maker,
                                                      refs: dict[str, str],
                                                      tmp_path: Path) -> None:
    m = make_manager(pinned=(refs["busybox"],))
    iid = await m.pull(refs["busybox"])
    assert m.status(iid).pinned  # type: ignore[union-attr]
    root = await m.prepare_rootfs("c1", iid)
    await m.close()
    # Debris of a crash: ingest file, unpack temp dir, an unrecorded layer dir.
    (m.content.ingest / "partial").write_bytes(b"x")
    (m.root / "tmp" / "unpack-dead").mkdir()
    (m.root / "layers" / ("e" * 64)).mkdir()
    m2 = make_manager(root=m.root)
    m2.recover()
    img = m2.status(refs["busybox"])
    assert img is not None and img.id == iid and not img.pinned
    assert is_mounted(root)  # mounts are left alone
    assert list(m2.content.ingest.iterdir()) == [] and list((m2.root / "tmp").iterdir()) == []
    assert not (m2.root / "layers" / ("e" * 64)).exists()
    await m2.remove_rootfs("c1")
    assert not is_mounted(root)


async def test_a_damaged_snapshot_row_never_keeps_its_rootfs(make_manager: Maker,
                                                             refs: dict[str, str]) -> None:
    """Issue 38: a snapshot row without its image ID (or with one of another type) made
    RemoveContainer a KeyError, every time: a container that could never go. The rootfs
    goes; the image is kept, and the sweep frees only what nothing holds."""
    m = make_manager()
    iid = await m.pull(refs["busybox"])
    for key, damaged in (("c1", {}), ("c2", {"image_id": ["not", "a", "string"]})):
        root = await m.prepare_rootfs(key, iid)
        rec = m._store.get(SNAPSHOT, key)
        assert rec is not None
        m._store.put(SNAPSHOT, key, {**{k: v for k, v in rec.items() if k != "image_id"},
                                     **damaged})
        await m.remove_rootfs(key)
        assert not is_mounted(root) and not m.snapshots.dir(key).exists()
        assert m._store.get(SNAPSHOT, key) is None
    image = m._store.get(IMAGE, iid)
    assert image is not None and m.status(iid) is not None
    assert image["chain_ids"] and all(m._store.get(LAYER, c) is not None
                                      for c in image["chain_ids"])


async def test_damaged_rows_are_set_aside_at_start_and_made_again_from_disk(
        make_manager: Maker, refs: dict[str, str]) -> None:
    """Issue 38, item 1: an image or snapshot row of the wrong shape is set aside when
    the manager loads it (image/rows.py), and what it described is made again from the
    disk: the image from its content (listed by ID, without its tag), the running
    container's rootfs held again by its image, so neither is swept."""
    m = make_manager()
    iid = await m.pull(refs["busybox"])
    before = m._store.get(IMAGE, iid)
    assert before is not None
    root = await m.prepare_rootfs("c1", iid)
    (root / "kept").write_text("x")
    m._store.put(IMAGE, iid, {**before, "blobs": "sha256:not-a-list"})
    m._store.put(SNAPSHOT, "c1", {"image_id": iid, "chain_ids": [7], "view": False})
    m2 = make_manager(root=m.root)
    m2.recover()
    assert m2._store.set_aside_counts() == {"image": 1, "image_snapshot": 1}
    found = m2.status(iid)
    assert found is not None and not found.repo_tags and found.size == before["size"]
    assert m2._store.get(IMAGE, iid)["chain_ids"] == before["chain_ids"]  # type: ignore[index]
    assert m2._store.get(SNAPSHOT, "c1") == {"image_id": iid, "chain_ids": before["chain_ids"],
                                             "view": False}
    assert (root / "kept").read_text() == "x" and is_mounted(root)
    await m2.remove_rootfs("c1")
    assert not m2.snapshots.dir("c1").exists()
    # Found again, it is an image like any other: a pull names it, a removal frees it.
    assert await m2.pull(refs["busybox"]) == iid
    assert m2.status(refs["busybox"]) is not None


async def test_removed_files_go_after_the_call_and_at_restart(make_manager: Maker,
                                                              refs: dict[str, str]) -> None:
    """RemoveImage returns once the image is out of every view; its files are unlinked
    after it, and a crash before that leaves them in tmp/, which the restart empties."""
    m = make_manager()
    await m.pull(refs["busybox"])
    reap = m._reap

    async def never() -> None:  # the process dies before its trash is removed
        await asyncio.Event().wait()

    m._reap = never  # type: ignore[method-assign]
    await m.remove(refs["busybox"])
    assert m.list() == [] and list((m.root / "layers").iterdir()) == []
    trash = list((m.root / "tmp").iterdir())
    assert trash and all(t.name.startswith("trash-") for t in trash)
    assert m._reaping is not None
    m._reaping.cancel()
    m._reap = reap  # type: ignore[method-assign]
    restarted = make_manager()
    restarted.recover()
    assert list((restarted.root / "tmp").iterdir()) == []
    assert await restarted.pull(refs["busybox"])
