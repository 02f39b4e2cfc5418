"""Read-only image views (image volumes): contents, read-only, layer holding, removal,
recovery, and sub paths resolved inside the image."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pycri import errors
from pycri.image.manager import IMAGE, SNAPSHOT
from pycri.image.snapshots import is_mounted, resolve_within
from tests.image.conftest import Maker
from tests.lib import images
from tests.lib.registry import Registry


async def test_view_is_the_image_read_only(make_manager: Maker, refs: dict[str, str]) -> None:
    m = make_manager()
    iid = await m.pull(refs["busybox"])
    view = await m.prepare_view("c1-vol0", iid)
    assert is_mounted(view)
    assert os.readlink(view / "bin/sh") == "busybox"
    assert not (view / "etc/removed").exists()  # whiteouts and opaque dirs apply
    assert sorted(os.listdir(view / "data")) == ["new"]
    for write in (lambda: (view / "new").write_text("x"), lambda: (view / "etc/motd").unlink(),
                  lambda: (view / "tmp/d").mkdir()):
        with pytest.raises(OSError) as e:
            write()
        assert e.value.errno == errno.EROFS
    assert not (m.snapshots.dir("c1-vol0") / "upper").exists()
    assert m._store.get(SNAPSHOT, "c1-vol0") == {
        "image_id": iid, "chain_ids": m._store.get(IMAGE, iid)["chain_ids"],  # type: ignore[index]
        "view": True}
    with pytest.raises(errors.NotFound):
        m.rootfs_usage("c1-vol0")  # a view has no writable layer to count
    assert (await m.container_fs_info()).used_bytes == 0
    assert await m.prepare_view("c1-vol0", iid) == view  # again: the same mount
    with pytest.raises(errors.AlreadyExists):
        await m.prepare_rootfs("c1-vol0", iid)  # a key is a view or a rootfs, not both
    await m.remove_view("c1-vol0")
    assert not is_mounted(view) and not m.snapshots.dir("c1-vol0").exists()
    assert m._store.get(SNAPSHOT, "c1-vol0") is None
    await m.remove_view("c1-vol0")  # absent: success


async def test_view_unknown_image_and_bad_key(make_manager: Maker,
                                              refs: dict[str, str]) -> None:
    m = make_manager()
    with pytest.raises(errors.NotFound):
        await m.prepare_view("v", "sha256:" + "a" * 64)
    iid = await m.pull(refs["busybox"])
    with pytest.raises(errors.InvalidArgument):
        await m.prepare_view("../v", iid)
    assert m.snapshots.list_keys() == [] and list(m._store.items(SNAPSHOT)) == []


async def test_view_holds_layers_after_image_removal(make_manager: Maker,
                                                     refs: dict[str, str]) -> None:
    m = make_manager()
    iid = await m.pull(refs["busybox"])
    view = await m.prepare_view("c1-vol0", iid)
    chains = m._store.get(IMAGE, iid)["chain_ids"]  # type: ignore[index]
    await m.remove(iid)
    assert m.status(iid) is None
    assert (view / "bin/busybox").exists()
    assert all((m.root / "layers" / c).is_dir() for c in chains)
    await m.remove_view("c1-vol0")
    assert not any((m.root / "layers" / c).exists() for c in chains)


async def test_view_of_empty_and_single_and_many_layer_images(
    make_manager: Maker, refs: dict[str, str], registry: Registry, tmp_path: Path
) -> None:
    """Overlay needs two lower dirs without an upper one, whatever the layer count."""
    m = make_manager()
    empty = await m.prepare_view("e", await m.pull(refs["empty"]))
    assert is_mounted(empty) and os.listdir(empty) == []
    one = images.push_image(registry.addr, tmp_path / "layout", "one", "v1",
                            [images.ImageSpec(layers=[[images.file("f", "1")]])])
    view = await m.prepare_view("one", await m.pull(one))
    assert (view / "f").read_text() == "1"
    # 70 layers: absolute paths overflow a page, the short relative form is used.
    layers = [[images.file(f"f{i}", str(i))] for i in range(70)]
    many = images.push_image(registry.addr, tmp_path / "layout", "manyv", "v1",
                             [images.ImageSpec(layers=layers)])
    view = await m.prepare_view("many", await m.pull(many))
    assert sorted(os.listdir(view)) == sorted(f"f{i}" for i in range(70))
    with pytest.raises(OSError):
        (view / "f0").write_text("x")
    for key in ("e", "one", "many"):
        await m.remove_view(key)
    assert m.snapshots.list_keys() == []


async def test_recover_keeps_views(make_manager: Maker, refs: dict[str, str]) -> None:
    m = make_manager()
    iid = await m.pull(refs["busybox"])
    view = await m.prepare_view("c1-vol0", iid)
    await m.close()
    m2 = make_manager(root=m.root)
    m2.recover()
    assert is_mounted(view) and m2._store.get(SNAPSHOT, "c1-vol0") is not None
    await m2.remove(iid)
    assert (view / "bin/busybox").exists()  # still held after the restart
    await m2.remove_view("c1-vol0")
    assert not is_mounted(view) and list((m2.root / "layers").iterdir()) == []


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """An image-like tree with relative, absolute and escaping symlinks."""
    root = tmp_path / "img"
    (root / "usr/lib/x").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/passwd").write_text("root\n")
    (root / "lib").symlink_to("usr/lib")
    (root / "abs").symlink_to("/usr/lib")  # means the image's /usr/lib
    (root / "up").symlink_to("../../../..")  # clamps at the image root
    (root / "hostetc").symlink_to("/etc/../etc")
    (root / "loop").symlink_to("loop")
    (tmp_path / "outside").mkdir()
    return root


@pytest.mark.parametrize(("sub", "want"), [
    ("etc", "etc"), ("etc/passwd", "etc/passwd"), ("./etc/", "etc"), ("lib/x", "usr/lib/x"),
    ("abs/x", "usr/lib/x"), ("up", ""), ("up/etc", "etc"), ("hostetc/passwd", "etc/passwd"),
])
def test_resolve_within_follows_links_inside_the_image(tree: Path, sub: str, want: str) -> None:
    got = resolve_within(tree, sub)
    assert got == (tree / want if want else tree)
    assert got.exists() and not got.is_symlink()


@pytest.mark.parametrize(("sub", "message"), [
    ("/etc", "must be relative"), ("../outside", "must not contain '..'"),
    ("etc/../../outside", "must not contain '..'"), ("nope", "does not exist"),
    ("etc/passwd/x", "does not exist"), ("up/outside", "does not exist"),
    ("loop", "too many symlinks"),
])
def test_resolve_within_refuses(tree: Path, sub: str, message: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=message):
        resolve_within(tree, sub)
