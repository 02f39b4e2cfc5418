"""Container root filesystems and image views: overlay snapshots over an image's
layers, each recorded so that it holds those layers until it is removed, and the
usage of their writable layers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from pycri import errors
from pycri.image.base import IMAGE, LAYER, SNAPSHOT, ImageBase, _strings
from pycri.image.snapshots import Idmap
from pycri.image.types import FsUsage
from pycri.image.unpack import disk_usage


class ImageRootfs(ImageBase):
    """Root filesystems and read-only views of images, each holding its layers."""

    async def prepare_rootfs(self, key: str, image_id: str, idmap: Idmap | None = None) -> Path:
        """Overlay rootfs for container `key`; holds the image's layers until removed.
        With `idmap`, the layers appear owned by their on-disk IDs in a user namespace."""
        return await self._prepare(key, image_id, readonly=False, idmap=idmap)

    async def prepare_view(self, key: str, image_id: str, idmap: Idmap | None = None) -> Path:
        """A read-only view of the image (an image volume), held like a rootfs: a
        RemoveImage while it is mounted keeps its layers until `remove_view(key)`."""
        return await self._prepare(key, image_id, readonly=True, idmap=idmap)

    async def _prepare(
        self, key: str, image_id: str, readonly: bool, idmap: Idmap | None
    ) -> Path:
        iid = self._resolve(image_id)
        rec = self._store.get(IMAGE, iid) if iid else None
        if rec is None or iid is None:
            raise errors.NotFound(f"image {image_id!r} not found")
        self.snapshots.dir(key)  # validates the key
        existing = self._store.get(SNAPSHOT, key)
        if existing is not None and (
            existing.get("image_id") != iid or existing.get("view", False) != readonly
        ):
            raise errors.AlreadyExists(f"snapshot {key!r} exists for another image")
        chains = _strings(rec, "chain_ids")
        missing = [c for c in chains if self._store.get(LAYER, c) is None]
        if missing:
            raise errors.FailedPrecondition(f"image {iid}: layers missing, pull it again")
        self._store.put(SNAPSHOT, key, {"image_id": iid, "chain_ids": chains,
                                        "view": readonly})
        try:
            return await self.snapshots.prepare(key, chains, readonly=readonly, idmap=idmap)
        except BaseException:
            if existing is None:
                self._store.delete(SNAPSHOT, key)
            raise

    async def remove_rootfs(self, key: str) -> None:
        """Unmount and delete `key`'s rootfs; release its layers. Absent is success."""
        await self._release(key)

    async def remove_view(self, key: str) -> None:
        """Unmount and delete the view `key`; release its layers. Absent is success."""
        await self._release(key)

    async def _release(self, key: str) -> None:
        rec = self._store.get(SNAPSHOT, key)
        await self.snapshots.remove(key)
        if rec is None:
            return
        self._store.delete(SNAPSHOT, key)
        # A damaged row names no image: the rootfs still goes (its container must be
        # removable), and the sweep still frees what nothing holds.
        iid = rec.get("image_id")
        img = self._store.get(IMAGE, iid) if isinstance(iid, str) else None
        unnamed = img is not None and not _strings(img, "repo_tags") \
            and not _strings(img, "repo_digests")
        if unnamed and isinstance(iid, str) and not self._in_use(iid):
            self._store.delete(IMAGE, iid)
            self._reindex()
        await self._sweep()

    def rootfs_usage(self, key: str) -> tuple[int, int]:
        upper = self.snapshots.upper(key)
        if not upper.is_dir():
            raise errors.NotFound(f"rootfs {key!r} not found")
        return disk_usage(upper)

    async def container_fs_info(self) -> FsUsage:
        """Usage of all containers' writable layers (walked in a thread: they can be big)."""
        return await asyncio.to_thread(self._container_fs_info)

    def _container_fs_info(self) -> FsUsage:
        used = inodes = 0
        for key in self.snapshots.list_keys():
            with contextlib.suppress(FileNotFoundError, errors.NotFound):
                b, n = self.rootfs_usage(key)
                used, inodes = used + b, inodes + n
        return FsUsage(time.time_ns(), str(self.snapshots.root), used, inodes)
