"""Pulls from a real docker-registry: formats, platforms, mirrors, auth, failures."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from pycri import errors
from pycri.api import api_pb2 as pb
from pycri.image.answers import RegistryError
from pycri.image.auth import Auth, Secret
from pycri.image.content import DigestMismatch
from pycri.image.manager import IMAGE, LAYER
from tests.image.conftest import Maker, serve
from tests.lib import images
from tests.lib.registry import (
    BearerFront,
    HoldFront,
    Registry,
    StallFront,
    TrickleFront,
    free_port,
)


def _empty_state(m: object) -> None:
    """Nothing of a failed pull is left: no records, blobs, layers, temp or ingest files."""
    from pycri.image.manager import ImageManager

    assert isinstance(m, ImageManager)
    assert list(m._store.items(IMAGE)) == [] and list(m._store.items(LAYER)) == []
    assert list(m.content.digests()) == []
    assert list(m.content.ingest.iterdir()) == []
    assert list((m.root / "layers").iterdir()) == []
    assert list((m.root / "tmp").iterdir()) == []


async def test_pull_by_tag_then_status_by_every_name(make_manager: Maker, refs: dict[str, str],
                                                     registry: Registry) -> None:
    m = make_manager()
    iid = await m.pull(refs["busybox"])
    assert iid.startswith("sha256:") and len(iid) == 71
    img = m.status(refs["busybox"])
    assert img is not None and img.id == iid
    assert img.repo_tags == [refs["busybox"]]
    (dig,) = img.repo_digests
    assert dig.startswith(f"{registry.addr}/busybox@sha256:")
    assert img.size > 1_000_000 and img.uid is None and img.username == ""
    for name in (iid, iid[7:], iid[7:19], dig):
        found = m.status(name)
        assert found is not None and found.id == iid, name
    assert m.status("sha256:" + "0" * 64) is None and m.status("nosuchimage") is None
    assert [i.id for i in m.list()] == [iid] and m.list(refs["uid"]) == []
    assert m.image_config(iid)["config"]["Cmd"] == ["/bin/sh"]
    fs = m.fs_info()
    assert fs.used_bytes > img.size and fs.inodes_used > 100 and fs.mountpoint == str(m.root)


async def test_pull_by_digest_records_digest_only(make_manager: Maker,
                                                  refs: dict[str, str]) -> None:
    m = make_manager()
    iid = await m.pull(refs["busybox"])
    dig = m.status(iid).repo_digests[0]  # type: ignore[union-attr]
    await m.remove(iid)
    assert await m.pull(dig) == iid
    img = m.status(dig)
    assert img is not None and img.repo_tags == [] and img.repo_digests == [dig]
    with pytest.raises(errors.NotFound):
        await m.pull(dig.split("@")[0] + "@sha256:" + "1" * 64)


async def test_user_uid_and_username(make_manager: Maker, refs: dict[str, str]) -> None:
    m = make_manager()
    a = m.status(await m.pull(refs["uid"]))
    b = m.status(await m.pull(refs["username"]))
    assert a is not None and (a.uid, a.username) == (1000, "")
    assert b is not None and (b.uid, b.username) == (None, "user1")


@pytest.mark.parametrize("name", ["multi", "v2s2", "zstd"])
async def test_formats(make_manager: Maker, refs: dict[str, str], name: str) -> None:
    """OCI index (platform chosen), Docker schema2, zstd + uncompressed layers."""
    m = make_manager()
    iid = await m.pull(refs[name])
    cfg = m.image_config(iid)
    assert cfg["architecture"] == "amd64"
    root = await m.prepare_rootfs("c1", iid)
    assert (root / "bin" / "busybox").stat().st_size > 100_000
    assert (root / "etc" / "passwd").read_text().startswith("root:x:0:0")
    if name == "multi":
        img = m.status(refs[name])
        assert img is not None
        idx = img.repo_digests[0].split("@")[1]
        assert m.content.has(idx) and idx != iid


async def test_unknown_tag_and_unreachable(make_manager: Maker, registry: Registry) -> None:
    m = make_manager(connect_timeout=2.0)
    with pytest.raises(errors.NotFound):
        await m.pull(f"{registry.addr}/busybox:nosuchtag")
    with pytest.raises(errors.Unavailable):
        await m.pull(f"127.0.0.1:{free_port()}/busybox:latest")
    _empty_state(m)


async def test_mirror_for_short_name_and_fallback(make_manager: Maker, refs: dict[str, str],
                                                  registry: Registry, tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    (tmp_path / "registries.conf").write_text(f"""
[[registry]]
prefix = "docker.io"
location = "docker.io"
[[registry.mirror]]
location = "{dead}"
insecure = true
[[registry.mirror]]
location = "{registry.addr}"
insecure = true
""")
    (tmp_path / "registries.conf.d").mkdir()
    (tmp_path / "registries.conf.d" / "50-k8s.conf").write_text(f"""
[[registry]]
prefix = "registry.k8s.io"
location = "registry.k8s.io"
[[registry.mirror]]
location = "{registry.addr}"
[[registry]]
prefix = "{dead}"
location = "{dead}"
[[registry.mirror]]
location = "{registry.addr}"
""")
    m = make_manager(connect_timeout=2.0)
    iid = await m.pull("busybox")  # dead mirror, then the live one at library/busybox
    img = m.status("docker.io/library/busybox:latest")
    assert img is not None and img.id == iid and m.status("busybox") == img
    assert img.repo_tags == ["docker.io/library/busybox:latest"]
    iid2 = await m.pull("registry.k8s.io/multi:latest")
    img = m.status("registry.k8s.io/multi")
    assert img is not None and img.id == iid2
    # The amd64 entry of "multi" is the busybox image: one image, both names.
    assert any(d.startswith("registry.k8s.io/multi@sha256:") for d in img.repo_digests)
    assert "registry.k8s.io/multi:latest" in img.repo_tags
    # Upstream dead, mirror alive.
    uid_img = m.status(await m.pull(f"{dead}/busybox:uid"))
    assert uid_img is not None and uid_img.uid == 1000
    with pytest.raises(errors.Unavailable):  # no mirror for this one
        await m.pull(f"127.0.0.2:{free_port()}/a")


async def test_basic_auth(make_manager: Maker, tmp_path: Path) -> None:
    reg = Registry(tmp_path / "authreg", htpasswd=("alice", "s3cret")).start()
    try:
        # skopeo needs credentials to push.
        layout = tmp_path / "layout"
        images.write_layout(layout, "v1", [images.busybox_spec()])
        import subprocess
        subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                        "--dest-creds", "alice:s3cret", f"oci:{layout}:v1",
                        f"docker://{reg.addr}/private:v1"], check=True, capture_output=True)
        ref = f"{reg.addr}/private:v1"
        m = make_manager()
        with pytest.raises(RegistryError, match="credentials"):
            await m.pull(ref)
        with pytest.raises(RegistryError, match="refused"):
            await m.pull(ref, Auth(username="alice", password=Secret("wrong")))
        _empty_state(m)
        iid = await m.pull(ref, Auth(username="alice", password=Secret("s3cret")))
        await m.remove(iid)
        with pytest.raises(RegistryError):  # one caller's credentials are not reused for another
            await m.pull(ref)
        assert await m.pull(ref, Auth(auth=Secret("YWxpY2U6czNjcmV0"))) == iid
        # Credentials for another server are not sent.
        await m.remove(iid)
        m2 = make_manager(root=tmp_path / "root2")
        with pytest.raises(RegistryError):
            await m2.pull(ref, Auth(username="alice", password=Secret("s3cret"),
                                    server_address="quay.io"))
    finally:
        reg.stop()


async def test_bearer_token_flow(make_manager: Maker, refs: dict[str, str],
                                 registry: Registry) -> None:
    front = BearerFront(registry.addr, ("bob", "pw"))
    front.start()
    try:
        m = make_manager()
        with pytest.raises(RegistryError):
            await m.pull(f"{front.addr}/busybox:latest")
        auth = Auth(username="bob", password=Secret("pw"))
        iid = await m.pull(f"{front.addr}/busybox:latest", auth)
        assert m.status(refs["busybox"]) is None and m.status(iid) is not None
        await m.pull(f"{front.addr}/multi:latest", auth)
        scopes = [p for p in front.token_requests if "scope=" in p]
        assert any("busybox" in p for p in scopes) and any("multi" in p for p in scopes)
        # A ready-made registry token is used as is, with no token request.
        m2 = make_manager(root=m.root.parent / "root2")
        import base64
        tok = "tok." + base64.urlsafe_b64encode(b"repository:busybox:pull").decode()
        n = len(front.token_requests)
        assert await m2.pull(f"{front.addr}/busybox:uid", Auth(registry_token=Secret(tok)))
        assert len(front.token_requests) == n
    finally:
        front.stop()


async def test_corrupt_blob_is_refused_and_leaves_nothing(make_manager: Maker,
                                                          tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg").start()
    try:
        ref = images.push_busybox(reg.addr, tmp_path / "layout")
        spec = images.busybox_spec()
        raw = images.compress(images.tar_bytes(spec.layers[1]), "gzip")
        blob = reg.blob_path(images.sha(raw))
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        m = make_manager()
        with pytest.raises(DigestMismatch):
            await m.pull(ref)
        _empty_state(m)
    finally:
        reg.stop()


@pytest.mark.parametrize("mode", ["all", "blob"])
async def test_stalled_registry_times_out(make_manager: Maker, registry: Registry,
                                          refs: dict[str, str], mode: str) -> None:
    front = StallFront(registry.addr, mode)
    front.start()
    try:
        m = make_manager(pull_progress_timeout=1.0, read_timeout=30.0)
        t0 = time.monotonic()
        with pytest.raises(errors.DeadlineExceeded, match="no progress"):
            await m.pull(f"{front.addr}/busybox:latest")
        assert time.monotonic() - t0 < 8
        _empty_state(m)
    finally:
        front.stop()


async def test_concurrent_pulls_share_one_download(make_manager: Maker,
                                                   tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg").start()
    try:
        ref = images.push_busybox(reg.addr, tmp_path / "layout")
        m = make_manager()
        a, b = await asyncio.gather(m.pull(ref), m.pull(ref))
        assert a == b
        spec = images.busybox_spec()
        for entries in spec.layers:
            digest = images.sha(images.compress(images.tar_bytes(entries), "gzip"))
            assert reg.blob_gets(digest) == 1, digest
    finally:
        reg.stop()


async def test_layer_blobs_go_once_unpacked_unless_kept(make_manager: Maker,
                                                       tmp_path: Path) -> None:
    """Issue 40, item 2: an image costs its unpacked size. Its layer blobs go once the
    layers are unpacked and checked, unless `keep_layer_blobs`; sizes stay truthful;
    the same layer on another base (another snapshot) is fetched again and goes again."""
    reg = Registry(tmp_path / "reg").start()
    try:
        spec = images.busybox_spec()
        ref = images.push_busybox(reg.addr, tmp_path / "layout")
        layer_blobs = {images.sha(images.compress(images.tar_bytes(e), "gzip"))
                       for e in spec.layers}
        m = make_manager()
        iid = await m.pull(ref)
        kept = set(m.content.digests())
        assert len(kept) == 2 and not kept & layer_blobs  # the manifest and the config
        img = m.status(iid)
        assert img is not None and img.size > 1_000_000
        assert m.fs_info().used_bytes >= img.size
        assert await m.pull(ref) == iid  # the layers are there: no blob is fetched again
        assert all(reg.blob_gets(d) == 1 for d in layer_blobs)
        first = images.sha(images.compress(images.tar_bytes(spec.layers[0]), "gzip"))
        other = images.push_image(reg.addr, tmp_path / "layout2", "other", "v1", [
            images.ImageSpec(layers=[[images.file("extra", "x")], spec.layers[0]])])
        await asyncio.gather(m.pull(other), m.pull(ref))
        assert reg.blob_gets(first) == 2
        assert not set(m.content.digests()) & layer_blobs
        keeping = make_manager(root=tmp_path / "keeping", keep_layer_blobs=True)
        await keeping.pull(ref)
        assert layer_blobs <= set(keeping.content.digests())
    finally:
        reg.stop()


async def test_hostile_image_refused_and_leaves_nothing(make_manager: Maker, registry: Registry,
                                                        tmp_path: Path) -> None:
    evil = [images.file("ok", "fine"), images.symlink("esc", "/tmp"),
            images.file("esc/pycri-escaped", "pwned")]
    ref = images.push_image(registry.addr, tmp_path / "layout", "evil", "v1",
                            [images.ImageSpec(layers=[evil])])
    m = make_manager()
    with pytest.raises(errors.InvalidArgument, match="symlink"):
        await m.pull(ref)
    assert not Path("/tmp/pycri-escaped").exists()
    _empty_state(m)


# ---- pulls nobody waits for, pulls that make no progress (issue 22, part 9) ---------------

async def _eventually_empty(m: object) -> None:
    """_empty_state within 10 s: the server-side pull of a call that ended client-side
    may still be cleaning up."""
    deadline = time.monotonic() + 10
    while True:
        try:
            _empty_state(m)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


async def test_pull_ends_when_its_client_gives_up(make_manager: Maker, registry: Registry,
                                                  refs: dict[str, str], tmp_path: Path) -> None:
    """A manifest trickled at 20 bytes/s: the client's deadline (2 s) must close pycri's
    connection to the registry, where it used to stay open until the manifest was in."""
    front = TrickleFront(registry.addr, delay=0.05)
    front.start()
    try:
        m = make_manager(pull_progress_timeout=120.0)
        async with serve(m, tmp_path / "img.sock") as stub:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.PullImage(pb.PullImageRequest(
                    image=pb.ImageSpec(image=f"{front.addr}/busybox:latest")), timeout=2)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            gave_up = time.monotonic()
            assert await asyncio.to_thread(front.wait_ended, 8), "connection still open"
            (t,) = front.trickles
            assert not t.completed and t.ended is not None and t.ended - gave_up < 5
        await _eventually_empty(m)
    finally:
        front.stop()


async def test_shared_pull_goes_on_for_the_client_still_waiting(
    make_manager: Maker, registry: Registry, refs: dict[str, str], tmp_path: Path
) -> None:
    """Two clients pull one image (one pull, one manifest request); the one that gives
    up leaves it running for the other, which gets the image."""
    front = TrickleFront(registry.addr, delay=0.005)  # the manifest takes a few seconds
    front.start()
    try:
        m = make_manager(pull_progress_timeout=60.0)
        ref = f"{front.addr}/busybox:latest"
        request = pb.PullImageRequest(image=pb.ImageSpec(image=ref))
        async with serve(m, tmp_path / "img.sock") as stub:
            staying = asyncio.ensure_future(stub.PullImage(request))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.PullImage(request, timeout=1)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            iid = (await staying).image_ref
        assert m.status(ref) is not None and m.status(ref).id == iid  # type: ignore[union-attr]
        assert front.requests.count("/v2/busybox/manifests/latest") == 1
        (t,) = front.trickles
        assert t.completed
    finally:
        front.stop()


async def test_distinct_pulls_past_the_bound_are_refused(
    make_manager: Maker, registry: Registry, refs: dict[str, str], tmp_path: Path
) -> None:
    """Issue 39, item 4: every distinct pull may hold a few registry documents (up to
    4 MiB each), and there was no bound on how many ran at once. Past
    `images.max_concurrent_pulls` a new one is RESOURCE_EXHAUSTED; a pull of the same
    reference joins the running one."""
    front = TrickleFront(registry.addr, delay=0.005)  # the manifest takes a few seconds
    front.start()
    try:
        m = make_manager(pull_progress_timeout=60.0, max_concurrent_pulls=1)
        slow = f"{front.addr}/busybox:latest"
        first = asyncio.ensure_future(m.pull(slow))
        await asyncio.sleep(0.2)
        with pytest.raises(errors.ResourceExhausted, match=r"images\.max_concurrent_pulls"):
            await m.pull(refs["uid"])
        assert await asyncio.gather(first, m.pull(slow)) and m.status(refs["uid"]) is None
        assert await m.pull(refs["uid"])  # the bound is given back with the pull
    finally:
        front.stop()


@pytest.mark.parametrize("what", ["/manifests/", "/blobs/"])
async def test_trickle_is_no_progress(make_manager: Maker, registry: Registry,
                                      refs: dict[str, str], tmp_path: Path, what: str) -> None:
    """One byte every 0.3 s is no progress: with pull_progress_timeout = 1 s the pull
    fails in seconds, naming the setting (each byte used to restart the clock)."""
    front = TrickleFront(registry.addr, delay=0.3, what=what)
    front.start()
    try:
        m = make_manager(pull_progress_timeout=1.0)
        async with serve(m, tmp_path / "img.sock") as stub:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.PullImage(pb.PullImageRequest(
                    image=pb.ImageSpec(image=f"{front.addr}/busybox:latest")), timeout=20)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "pull_progress_timeout" in (e.value.details() or ""), e.value.details()
        assert await asyncio.to_thread(front.wait_ended, 5)
        await _eventually_empty(m)
    finally:
        front.stop()


async def test_a_layer_row_of_the_wrong_type_is_counted_again_from_disk(
        make_manager: Maker, refs: dict[str, str]) -> None:  # fmt: skip
    """Issue 38: a layer row whose sizes were not numbers made ImageFsInfo INTERNAL
    (`TypeError` adding them up). The row is read as what it must be; one that is not
    is counted again from the layer on disk, and the image stays."""
    from pycri.image.base import LAYER

    m = make_manager()
    iid = await m.pull(refs["busybox"])
    good = m.fs_info()
    chain, rec = next(iter(m._store.items(LAYER)))
    m._store.put(LAYER, chain, {**rec, "bytes": "many", "inodes": [1]})
    damaged = m.fs_info()  # answers, counting what it can
    assert damaged.used_bytes < good.used_bytes
    await m.close()
    m2 = make_manager(root=m.root)
    m2.recover()
    assert m2.status(iid) is not None
    again = m2.fs_info()
    assert (again.used_bytes, again.inodes_used) == (good.used_bytes, good.inodes_used)


def _many_files_image(reg: Registry, layout: Path, n: int = 2000) -> tuple[str, int]:
    """One layer of `n` incompressible 4 KiB files (its first half on the wire holds
    about its first half of files: more than the 1 MiB the unpack reads at a time);
    returns the reference and the layer's blob size."""
    entries = [images.directory("d")] + [images.file(f"d/f{i:04}", os.urandom(4096))
                                         for i in range(n)]
    spec = images.ImageSpec(layers=[entries])
    ref = images.push_image(reg.addr, layout, "many", "v1", [spec])
    return ref, len(images.compress(images.tar_bytes(entries), "gzip"))


def _one_mirror(tmp_path: Path, registry: str, mirror: str) -> None:
    """registries.conf: `registry` (plain http) with one mirror, `mirror`, before it."""
    (tmp_path / "registries.conf").write_text(f"""
[[registry]]
prefix = "{registry}"
location = "{registry}"
insecure = true
[[registry.mirror]]
location = "{mirror}"
insecure = true
""")


@contextlib.contextmanager
def _held(tmp_path: Path, **front: Any) -> Iterator[tuple[Registry, HoldFront, str]]:
    """A registry with `_many_files_image`, a HoldFront before it (its `front`
    settings), and the image's reference at the registry; all stopped at the end."""
    reg = Registry(tmp_path / "reg").start()
    hold = HoldFront(reg.addr, **front)
    hold.start()
    try:
        yield reg, hold, _many_files_image(reg, tmp_path / "layout")[0]
    finally:
        hold.release.set()
        hold.stop()
        reg.stop()


async def test_a_layer_unpacks_while_it_downloads(make_manager: Maker, tmp_path: Path) -> None:
    """Issue 40, item 1: a layer's files are written as its bytes arrive, and no
    compressed copy of it touches the disk (it is not kept)."""
    with _held(tmp_path, over=100_000) as (reg, front, ref):
        m = make_manager()
        pulling = asyncio.ensure_future(m.pull(ref.replace(reg.addr, front.addr)))
        assert await asyncio.to_thread(front.holding.wait, 20), "the layer was never asked for"

        def unpacked_so_far() -> int:
            return sum(len(list((d / "d").iterdir())) for d in (m.root / "tmp").iterdir()
                       if (d / "d").is_dir())

        deadline = time.monotonic() + 10
        while unpacked_so_far() < 100:
            assert time.monotonic() < deadline, f"{unpacked_so_far()} files while held"
            await asyncio.sleep(0.05)
        assert not pulling.done()
        assert list(m.content.ingest.iterdir()) == []  # no compressed copy on the disk
        front.release.set()
        iid = await pulling
        img = m.status(iid)
        assert img is not None
        (chain,) = m._store.get(IMAGE, iid)["chain_ids"]  # type: ignore[index]
        assert len(list((m.root / "layers" / chain / "d").iterdir())) == 2000
        assert list((m.root / "tmp").iterdir()) == []


async def test_a_held_download_cancelled_leaves_nothing(make_manager: Maker,
                                                        tmp_path: Path) -> None:
    """The last client gone mid-layer: the download stops, the unpack stops with it and
    removes what it made; the next pull succeeds."""
    with _held(tmp_path, over=100_000) as (reg, front, ref):
        m = make_manager()
        pulling = asyncio.ensure_future(m.pull(ref.replace(reg.addr, front.addr)))
        assert await asyncio.to_thread(front.holding.wait, 20)
        await asyncio.sleep(0.3)
        pulling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pulling
        _empty_state(m)
        assert await m.pull(ref)


async def test_a_mirror_serving_wrong_bytes_gives_way(make_manager: Maker,
                                                      tmp_path: Path) -> None:
    """A mirror whose layer bytes do not match the digest (the unpack meets garbage
    before the digest can be checked): the registry is tried next, and the pull
    succeeds with nothing of the bad bytes left. Bad bytes from the only endpoint
    are its DigestMismatch, not the unpack's complaint about them."""
    with _held(tmp_path, over=1 << 30, corrupt=True) as (reg, bad, ref):
        _one_mirror(tmp_path, reg.addr, bad.addr)
        m = make_manager()
        iid = await m.pull(ref)
        assert any("/blobs/" in r for r in bad.requests)
        (chain,) = m._store.get(IMAGE, iid)["chain_ids"]  # type: ignore[index]
        assert len(list((m.root / "layers" / chain / "d").iterdir())) == 2000
        assert list((m.root / "tmp").iterdir()) == []
        alone = make_manager(root=tmp_path / "alone")
        (tmp_path / "registries.conf").write_text("")
        with pytest.raises(DigestMismatch):
            await alone.pull(ref.replace(reg.addr, bad.addr))
        _empty_state(alone)


async def test_parallel_streamed_layers_match_a_serial_unpack(make_manager: Maker,
                                                              tmp_path: Path) -> None:
    """Issue 40, item 5: the layers a pull streams and unpacks at once (whiteouts, an
    opaque directory, hard links, across three layers) are, byte for byte and bit for
    bit, what unpacking each blob alone and in order gives."""
    from pycri.image.unpack import unpack_layer
    from tests.lib.trees import tree

    reg = Registry(tmp_path / "reg").start()
    try:
        ref = images.push_busybox(reg.addr, tmp_path / "layout")
        m = make_manager()
        iid = await m.pull(ref)
        chains = m._store.get(IMAGE, iid)["chain_ids"]  # type: ignore[index]
        spec = images.busybox_spec()
        (tmp_path / "serial-tmp").mkdir()
        for n, (entries, chain) in enumerate(zip(spec.layers, chains, strict=True)):
            raw = images.tar_bytes(entries)
            blob = reg.blob_path(images.sha(images.compress(raw, "gzip")))
            alone = tmp_path / f"serial-{n}"
            unpack_layer(blob, alone, tmp_path / "serial-tmp", images.sha(raw))
            assert tree(m.root / "layers" / chain) == tree(alone), n
    finally:
        reg.stop()


async def test_a_trickling_mirror_gives_way_to_the_next(make_manager: Maker, registry: Registry,
                                                        refs: dict[str, str], tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 42, item 4: a mirror whose blobs make no progress for
    pull_progress_timeout is left for the next endpoint (here the registry itself),
    which the pull finishes from; the stall is logged with the layer and the mirror."""
    front = TrickleFront(registry.addr, delay=0.3, what="/blobs/")
    front.start()
    try:
        _one_mirror(tmp_path, registry.addr, front.addr)
        m = make_manager(pull_progress_timeout=1.0)
        t0 = time.monotonic()
        iid = await m.pull(refs["busybox"])
        assert m.status(iid) is not None and time.monotonic() - t0 < 20
        assert any("/blobs/" in r for r in front.requests)
        assert await asyncio.to_thread(front.wait_ended, 5)
        stalls = [r.getMessage() for r in caplog.records if "no progress" in r.getMessage()]
        assert stalls and all(front.addr in s and "sha256:" in s for s in stalls), stalls
    finally:
        front.stop()
