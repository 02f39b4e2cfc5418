"""Hostile images (issue 8): each attack of the corpus is refused at pull with a clear
error, nothing of it is stored, and a canary on the host is untouched byte for byte."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from pycri import errors
from pycri.api import api_pb2 as pb
from pycri.image.content import ContentStore
from pycri.image.manager import IMAGE
from pycri.image.pull import _first_error
from pycri.image.unpack import unpack_layer
from pycri.server.errors import status_code
from tests.image.conftest import Maker, serve
from tests.image.test_pull import _empty_state
from tests.lib import hostile, images
from tests.lib.hostile import HostileRegistry
from tests.lib.registry import HugeManifestFront, Registry

# Small bounds so that bombs are refused after a few MiB (the defaults allow 64 MiB).
BOUNDS = {"max_layer_expansion_ratio": 100.0, "min_layer_unpacked_bytes": 4 << 20,
          "free_space_reserve": 0}


@pytest.mark.parametrize("name", hostile.NAMES)
async def test_hostile_image(name: str, make_manager: Maker, hostile_registry: HostileRegistry,
                             tmp_path: Path) -> None:
    """Over gRPC: the pull gets the right code and an actionable message, the node's
    image list still answers, nothing is stored, and the host canary is unchanged."""
    canary = hostile.make_canary(tmp_path)
    before = hostile.snapshot(canary)
    ref = hostile_registry.push("corpus", name, hostile.build(name, canary))
    m = make_manager(**BOUNDS)
    expect = hostile.EXPECT[name]
    async with serve(m, tmp_path / "img.sock") as stub:
        pull = stub.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)))
        if expect is None:
            iid = (await pull).image_ref
            assert [i.id for i in (await stub.ListImages(pb.ListImagesRequest())).images] == [iid]
            await stub.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=iid)))
        else:
            cls, pattern = expect
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await pull
            assert e.value.code() == status_code(cls("")), e.value.details()
            assert re.search(pattern, e.value.details() or ""), e.value.details()
        assert not (await stub.ListImages(pb.ListImagesRequest())).images
    await m.reaped()  # a removed image's files go after RemoveImage has answered
    _empty_state(m)
    assert hostile.snapshot(canary) == before


# ---- records stored by an older pycri (which accepted hostile images) -------------------

async def test_planted_records_list_status_and_remove(make_manager: Maker, refs: dict[str, str],
                                                      tmp_path: Path) -> None:
    m = make_manager()
    good = await m.pull(refs["uid"])
    base = m._store.get(IMAGE, good)
    assert base is not None
    planted = {}
    for i, (name, change) in enumerate(sorted(hostile.PLANTED.items())):
        iid = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
        tag = f"127.0.0.1:5000/planted/{name}:v{i}"
        m._store.put(IMAGE, iid, {**base, "id": iid, "repo_tags": [tag], "repo_digests": [],
                                  **change})
        planted[tag] = iid
    m._reindex()
    async with serve(m, tmp_path / "a.sock") as stub:
        listed = await stub.ListImages(pb.ListImagesRequest())
        assert {i.id for i in listed.images} == {good, *planted.values()}
        assert listed.ByteSize() < 64 << 10  # the 3.8 MB of annotations are not sent
    # A restart (a new manager over the same records, after recovery) sets aside the
    # rows whose fields are not of their types (image/rows.py), and serves the others,
    # each going the way `crictl rmi` takes: ImageStatus by name, RemoveImage by ID.
    m2 = make_manager(root=m.root)
    m2.recover()
    mistyped = {f"127.0.0.1:5000/planted/{name}:v{i}" for i, name in enumerate(
        sorted(hostile.PLANTED)) if name in hostile.MISTYPED}
    assert m2._store.set_aside_counts() == {"image": len(hostile.MISTYPED)}
    planted = {tag: iid for tag, iid in planted.items() if tag not in mistyped}
    async with serve(m2, tmp_path / "b.sock") as stub:
        assert len((await stub.ListImages(pb.ListImagesRequest())).images) == 1 + len(planted)
        for tag, iid in planted.items():
            st = await stub.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=tag),
                                                              verbose=True))
            assert st.image.id == iid, tag
            await stub.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=st.image.id)))
        listed = await stub.ListImages(pb.ListImagesRequest())
        assert [i.id for i in listed.images] == [good]
        assert listed.images[0].uid.value == 1000
    # The good image's content survived every sweep those removals ran.
    assert m2.status(good) is not None and await m2.prepare_rootfs("c1", good)


async def test_planted_names_and_records_of_any_shape(make_manager: Maker, refs: dict[str, str],
                                                   tmp_path: Path) -> None:
    m = make_manager()
    iid = await m.pull(refs["uid"])
    rec = m._store.get(IMAGE, iid)
    assert rec is not None
    m._store.put(IMAGE, iid, {**rec, "repo_tags": [*rec["repo_tags"], "x\ud800", 5]})
    junk = "sha256:" + "e" * 64
    m._store.put(IMAGE, junk, ["not", "a", "record"])  # type: ignore[arg-type]
    m._reindex()
    async with serve(m, tmp_path / "d.sock") as stub:
        by_id = {i.id: i for i in (await stub.ListImages(pb.ListImagesRequest())).images}
        assert list(by_id[iid].repo_tags) == [refs["uid"]] and by_id.keys() == {iid, junk}
        st = await stub.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=junk)))
        assert st.image.id == junk
        await stub.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=junk)))
        assert [i.id for i in (await stub.ListImages(pb.ListImagesRequest())).images] == [iid]


# ---- sizes, bounds and full disks ---------------------------------------------------------

async def test_size_is_the_unpacked_size(make_manager: Maker, hostile_registry: HostileRegistry,
                                         tmp_path: Path) -> None:
    """A 3 MiB file of zeros is a few KiB on the wire; the node pays 3 MiB for it."""
    img = hostile.HostileImage(*_zeros_layer(3 << 20))
    ref = hostile_registry.push("sizes", "zeros", img)
    m = make_manager()
    iid = await m.pull(ref)
    wire = sum(len(b) for b in img.layers)
    assert wire < 64 << 10
    (listed,) = m.list()
    status = m.status(iid)
    assert status is not None and listed.size == status.size >= 3 << 20


def _zeros_layer(n: int) -> tuple[list[bytes], dict[str, Any]]:
    raw = images.tar_bytes([images.file("zeros", bytes(n))])
    return [images.compress(raw, "gzip")], hostile.config_for([images.sha(raw)])


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mount tmpfs file systems of a given size (unmounted at the end, whatever happens)."""
    mounts: list[Path] = []

    def mount(size: str) -> Path:
        d = tmp_path / f"tmpfs{len(mounts)}"
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                        str(d)], check=True)
        mounts.append(d)
        return d

    yield mount
    for d in reversed(mounts):
        subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.mark.parametrize(("size", "reserve", "keep", "full"), [
    ("600k", 0, True, r"blob sha256:\w+ of \d+ bytes does not fit in the free space"),
    ("16m", 31 << 19, True, r"blob sha256:\w+ of \d+ bytes does not fit in the free space"),
    ("2m", 0, True, r"unpacks to more than \d+ bytes \(the free space of"),
    ("600k", 0, False, r"layer \w{64}: unpacks to more than \d+ bytes \(the free space of"),
], ids=["blob-too-big", "blob-eats-reserve", "unpack-too-big", "streamed-too-big"])
async def test_disk_full_during_pull(small_fs: Callable[[str], Path], make_manager: Maker,
                                     refs: dict[str, str], size: str, reserve: int, keep: bool,
                                     full: str) -> None:
    """A kept 1 MB layer blob does not fit (or would eat the reserve); or it fits and its
    2 MB unpacked do not. Streamed (not kept), only the unpacked bytes need room."""
    root = small_fs(size)
    m = make_manager(root=root / "root", free_space_reserve=reserve, keep_layer_blobs=keep)
    with pytest.raises(errors.ResourceExhausted, match=full):
        await m.pull(refs["busybox"])
    _empty_state(m)
    # Space freed (here: a bigger disk), the same pull completes.
    m2 = make_manager(root=small_fs("16m") / "root", free_space_reserve=0)
    assert await m2.pull(refs["busybox"])


def test_unpack_enospc_leaves_nothing(small_fs: Callable[[str], Path], tmp_path: Path) -> None:
    """The disk itself filling up mid-unpack (no bound to stop it first)."""
    raw = images.tar_bytes(images.busybox_layers()[0])
    blob = tmp_path / "blob"
    blob.write_bytes(images.compress(raw, "gzip"))
    fs = small_fs("1m")
    (fs / "tmp").mkdir()
    with pytest.raises(errors.ResourceExhausted, match="no space left"):
        unpack_layer(blob, fs / "layer", fs / "tmp", images.sha(raw))
    assert list((fs / "tmp").iterdir()) == [] and not (fs / "layer").exists()


def test_blob_enospc_leaves_nothing(small_fs: Callable[[str], Path]) -> None:
    """The disk filling up under a blob download (the size check passed: a race)."""
    store = ContentStore(small_fs("1m") / "content")
    data = os.urandom(2 << 20)
    w = store.writer(images.sha(data), len(data))
    with pytest.raises(errors.ResourceExhausted, match="no space left"):
        for i in range(0, len(data), 64 << 10):
            w.write(data[i : i + (64 << 10)])
    w.abort()
    assert list(store.ingest.iterdir()) == [] and not store.has(images.sha(data))


def test_first_error_unwraps_groups() -> None:
    inner = ExceptionGroup("tg", [ValueError("v"), errors.NotFound("n")])
    assert isinstance(_first_error(ExceptionGroup("outer", [inner])), errors.NotFound)
    assert isinstance(_first_error(ExceptionGroup("g", [OSError("o")])), OSError)


async def test_bad_registry_port_over_grpc(make_manager: Maker, tmp_path: Path) -> None:
    """Port 99999 used to come back INTERNAL: ExceptionGroup from a TaskGroup."""
    async with serve(make_manager(), tmp_path / "c.sock") as stub:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.PullImage(pb.PullImageRequest(
                image=pb.ImageSpec(image="127.0.0.1:99999/busybox:latest")))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "port '99999' is not in 1-65535" in (e.value.details() or "")


async def test_bad_port_in_registries_conf(make_manager: Maker, refs: dict[str, str],
                                           registry: Registry, tmp_path: Path) -> None:
    """A mirror at port 99999 is skipped for the next endpoint; a location there is a
    clear InvalidArgument (both used to be INTERNAL: OverflowError from the socket)."""
    (tmp_path / "registries.conf").write_text(f"""
[[registry]]
prefix = "{registry.addr}"
location = "{registry.addr}"
[[registry.mirror]]
location = "127.0.0.1:99999"
insecure = true
[[registry]]
prefix = "mirrored.test:1"
location = "127.0.0.1:99999"
insecure = true
""")
    m = make_manager()
    assert await m.pull(refs["busybox"])
    with pytest.raises(errors.InvalidArgument, match=r"'127\.0\.0\.1:99999' is not usable"):
        await m.pull("mirrored.test:1/busybox:latest")


@pytest.mark.parametrize("framing", ["length", "short", "chunked"])
async def test_huge_manifest_stops_at_the_limit(make_manager: Maker, registry: Registry,
                                                tmp_path: Path, framing: str) -> None:
    """An 8 MiB manifest: refused with INVALID_ARGUMENT (it used to be UNKNOWN), having
    read at most the 4 MiB limit and one network read more; nothing at all when its
    Content-Length says so up front. A Content-Length of 1000 ends the body there."""
    front = HugeManifestFront(registry.addr, 8 << 20, framing)
    front.start()
    try:
        m = make_manager()
        async with serve(m, tmp_path / "img.sock") as stub:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.PullImage(pb.PullImageRequest(
                    image=pb.ImageSpec(image=f"{front.addr}/big:latest")), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        if framing == "short":
            assert "not valid JSON" in (e.value.details() or "")
            assert front.sent <= front.PIECE
        else:
            assert "larger than 4194304 bytes" in (e.value.details() or "")
            read_at_most = front.PIECE if framing == "length" else (4 << 20) + 2 * front.PIECE
            assert front.sent <= read_at_most, front.sent
        _empty_state(m)
    finally:
        front.stop()
