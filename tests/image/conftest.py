"""Fixtures for image tests: one real registry per session with the standard images."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from pycri.api import api_pb2_grpc
from pycri.config import ImagesConfig
from pycri.image.manager import ImageManager
from pycri.image.snapshots import is_mounted
from pycri.server import wire
from pycri.server.image_service import ImageServicer
from pycri.store.db import Store
from tests.lib import images
from tests.lib.hostile import HostileRegistry
from tests.lib.registry import Registry


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = Registry(tmp_path_factory.mktemp("registry"))
    reg.start()
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def hostile_registry(registry: Registry) -> Iterator[HostileRegistry]:
    """The session registry behind a front that also serves manifests it refuses."""
    front = HostileRegistry(registry.addr)
    front.start()
    yield front
    front.stop()


@pytest.fixture(scope="session")
def refs(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Standard images pushed once: name -> reference."""
    layout = tmp_path_factory.mktemp("layout")
    a = registry.addr
    return {
        "busybox": images.push_busybox(a, layout),
        "library": images.push_busybox(a, layout, name="library/busybox"),
        "uid": images.push_busybox(a, layout, tag="uid", user="1000"),
        "username": images.push_busybox(a, layout, tag="named", user="user1:extra"),
        "multi": images.push_image(a, layout, "multi", "latest",
                                   [images.busybox_spec(), images.arm64_spec()]),
        "v2s2": images.push_image(a, layout, "v2s2", "latest", [images.busybox_spec()],
                                  fmt="v2s2"),
        "zstd": images.push_image(a, layout, "zstd", "latest", [images.busybox_spec(
            compressions=["zstd", "none", "gzip"])]),
        "empty": images.push_image(a, layout, "empty", "latest", [images.ImageSpec(layers=[])]),
    }


Maker = Callable[..., ImageManager]


@pytest.fixture
async def make_manager(tmp_path: Path) -> AsyncIterator[Maker]:
    """Build ImageManagers on tmp roots; tears down their mounts, clients and stores."""
    made: list[tuple[ImageManager, Store]] = []

    def make(root: Path | None = None, pinned: tuple[str, ...] = (), **cfg: Any) -> ImageManager:
        root = root or tmp_path / "root"
        conf = {"registries_conf": str(tmp_path / "registries.conf"),
                "registries_conf_dir": str(tmp_path / "registries.conf.d"),
                "pull_progress_timeout": 10.0, **cfg}
        for _, earlier in made:  # a "restart": the old process' store is gone (its lock too)
            if earlier.path == root / "pycri.db":
                earlier.close()
        store = Store(root / "pycri.db")
        m = ImageManager(root, ImagesConfig(**conf), store, pinned)
        made.append((m, store))
        return m

    yield make
    for m, store in made:
        for key in m.snapshots.list_keys():
            with contextlib.suppress(Exception):
                await m.remove_rootfs(key)
            rootfs = m.snapshots.dir(key) / "rootfs"
            if rootfs.exists() and is_mounted(rootfs):
                subprocess.run(["umount", "-l", str(rootfs)], check=False)
        await m.close()
        store.close()


@contextlib.asynccontextmanager
async def serve(m: ImageManager, sock: Path) -> AsyncIterator[api_pb2_grpc.ImageServiceStub]:
    """The ImageService for `m` over real gRPC on a unix socket."""
    server = grpc.aio.server()
    wire.register(api_pb2_grpc.add_ImageServiceServicer_to_server, ImageServicer(m), server)
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix://{sock}")
    try:
        yield api_pb2_grpc.ImageServiceStub(channel)
    finally:
        await channel.close(None)
        await server.stop(None)
