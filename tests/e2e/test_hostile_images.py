"""Hostile images against a real `pycri serve`: refused pulls over the CRI socket, and
records an older pycri stored for such images, listed and removable across restarts."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from pycri.image.manager import IMAGE
from pycri.store.db import Store
from tests.conftest import NO_DEFAULT_CADVISOR, PycriProcess, write_config
from tests.e2e.conftest import Node
from tests.lib import hostile
from tests.lib.registry import Registry

# Attacks the daemon's default bounds refuse too (the bombs need smaller ones: tests/image).
NAMES = ["config-not-object", "user-uid-overflow", "annotations-not-strings",
         "annotations-not-object", "annotations-huge", "rootfs-list", "symlink-then-write"]


def _images(node: Node) -> list[pb.Image]:
    return list(node.cri.image.ListImages(pb.ListImagesRequest()).images)


def test_hostile_pulls_and_stored_records(node: Node, registry: Registry, tmp_path: Path) -> None:
    front = hostile.HostileRegistry(registry.addr)
    front.start()
    try:
        canary = hostile.make_canary(tmp_path)
        before = hostile.snapshot(canary)
        (good,) = [i.id for i in _images(node)]
        for name in NAMES:
            ref = front.push("e2e-hostile", name, hostile.build(name, canary))
            with pytest.raises(grpc.RpcError) as e:
                node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)))
            expect = hostile.EXPECT[name]
            assert expect is not None
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, e.value.details())
            assert re.search(expect[1], e.value.details() or ""), e.value.details()
            assert [i.id for i in _images(node)] == [good]

        # Records as an older pycri stored them, planted while the daemon is down.
        node.cri.channel.close()
        assert node.proc.stop() == 0
        store = Store(node.tmp / "root" / "pycri.db")
        base = store.get(IMAGE, good)
        assert base is not None
        planted = {}
        for name, change in hostile.PLANTED.items():
            iid = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
            tag = f"127.0.0.1:5000/planted/{name}:v1"
            store.put(IMAGE, iid, {**base, "id": iid, "repo_tags": [tag], "repo_digests": [],
                                   **change})
            planted[tag] = iid
        store.close()
        node.start()

        # Those of the wrong types are set aside at the start (pycri/image/rows.py).
        planted = {t: i for t, i in planted.items() if t.split("/")[2].split(":")[0] not in
                   hostile.MISTYPED}
        assert {i.id for i in _images(node)} == {good, *planted.values()}
        for tag, iid in planted.items():  # what `crictl rmi <tag>` does
            st = node.cri.image.ImageStatus(pb.ImageStatusRequest(
                image=pb.ImageSpec(image=tag), verbose=True))
            assert st.image.id == iid
            node.cri.image.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=iid)))
        assert [i.id for i in _images(node)] == [good]
        node.restart()
        assert [i.id for i in _images(node)] == [good]
        assert hostile.snapshot(canary) == before
    finally:
        front.stop()


def test_bombs_refused_with_configured_bounds(registry: Registry, tmp_path: Path) -> None:
    """The bounds come from the daemon's TOML; a refused bomb leaves no byte on disk."""
    (tmp_path / "net.d").mkdir()
    config = write_config(tmp_path / "pycri.toml", (
        f'[cni]\nconf_dir = "{tmp_path / "net.d"}"\ndefault_network = false\n'
        f'[images]\nregistries_conf = "{tmp_path / "registries.conf"}"\n'
        f'registries_conf_dir = "{tmp_path / "registries.conf.d"}"\n'
        "max_layer_expansion_ratio = 10.0\nmin_layer_unpacked_bytes = 4194304\n"
        "free_space_reserve = 0\n"
        f'[nri]\nsocket_path = "{tmp_path / "nri.sock"}"\n'
        f'plugin_path = "{tmp_path / "nri-plugins"}"\n'
        f'{NO_DEFAULT_CADVISOR}'))
    root = tmp_path / "root"
    proc = PycriProcess(root=root, state=tmp_path / "state", socket=tmp_path / "state" / "s.sock",
                        config=config, log=tmp_path / "pycri.log")
    front = hostile.HostileRegistry(registry.addr)
    front.start()
    proc.start()
    cri = proc.client()
    try:
        for name in ("gzip-bomb", "gzip-bomb-wrong-diff-id"):
            ref = front.push("e2e-bombs", name, hostile.build(name, tmp_path))
            with pytest.raises(grpc.RpcError) as e:
                cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "unpacks to more than 4194304 bytes" in (e.value.details() or "")
            assert not cri.image.ListImages(pb.ListImagesRequest()).images
            assert list((root / "tmp").iterdir()) == [] and list((root / "layers").iterdir()) == []
            (fs,) = cri.image.ImageFsInfo(pb.ImageFsInfoRequest()).image_filesystems
            assert fs.used_bytes.value < 1 << 20  # no layer is accounted
    finally:
        cri.channel.close()
        front.stop()
        assert proc.stop() == 0, proc.log_text()[-3000:]
