"""ImageManager: pull, index, remove images and make container root filesystems.

Layout under the pycri root:
  content/blobs/sha256/<hex>   verified blobs (manifests, configs, layers)
  layers/<chain id hex>/       one unpacked layer, shared by every image using it
  l/<short>                    short links to layers, for long overlay option strings
  snapshots/<key>/             per-container upper/work/rootfs, or a read-only view
  tmp/                         unpack temp dirs and trash, emptied by recover()

Records (kind "image", "image_layer", "image_snapshot") live in the metadata
Store. Disk space is reclaimed by mark-and-sweep from those records, so a
blob or layer shared by two images lives as long as either does, and a
container's layers live as long as its snapshot does.

ImageManager is composed of one mixin per story over ImageBase (base.py: the state,
the record index and the mark-and-sweep), so mypy checks each against the shared
attributes: pull.py (the pull pipeline), rootfs.py (container root filesystems and
image views); this module keeps the queries on the records, removal, accounting and
recovery; found.py makes the records again from the disk when a damaged database
was set aside.
"""

from __future__ import annotations

import builtins
import logging
import shutil
import time
from collections.abc import Callable
from typing import Any

from pycri import errors
from pycri.image import rows, schema
from pycri.image.base import IMAGE, LAYER, SNAPSHOT, _count, _strings
from pycri.image.found import ImageFound
from pycri.image.pull import ImagePull
from pycri.image.rootfs import ImageRootfs
from pycri.image.snapshots import _umount, is_mounted
from pycri.image.types import FsUsage, Image, user_of
from pycri.image.unpack import disk_usage
from pycri.store.db import Record

log = logging.getLogger("pycri.image")


class ImageManager(ImagePull, ImageRootfs, ImageFound):
    """Every image of the node, the records that name them and the snapshots over them."""

    # ---- records -----------------------------------------------------------------------

    def _image(self, iid: str, rec: Record) -> Image:
        """The CRI view of a record, built defensively: a row's types are checked when it
        is loaded (rows.py), but the values an older pycri's pull accepted (a config
        that is not an object, annotations past the bound) must still be listed, so
        that the image can be seen and removed, without breaking the others."""
        rec = rec if isinstance(rec, dict) else {}
        config = rec.get("config")
        config = config if isinstance(config, dict) else {}
        uid, username = user_of(config)
        tags, digests = _strings(rec, "repo_tags"), _strings(rec, "repo_digests")
        size = rec.get("size")
        ann = rec.get("annotations")
        try:
            kept = schema.parse_annotations(ann, f"image {iid}")
        except errors.InvalidArgument as e:
            if iid not in self._warned:  # once, not on every ListImages
                self._warned.add(iid)
                log.warning("%s; listing it without annotations", e)
            kept = {}
        return Image(
            id=iid, repo_tags=tags, repo_digests=digests,
            size=size if isinstance(size, int) and 0 <= size < 2**63 else 0,
            uid=uid, username=username, pinned=bool({iid, *tags, *digests} & self._pinned),
            config=config, annotations=kept,
        )

    def status(self, ref: str) -> Image | None:
        iid = self._resolve(ref)
        rec = self._store.get(IMAGE, iid) if iid else None
        return self._image(iid, rec) if iid and rec else None

    def display_name(self, image_id: str, fallback: str) -> str:
        """How a container's image is named where people read it (the `image` label of
        cAdvisor's series and of ListPodSandboxMetrics): the image's first tag, else its
        first repo digest, as containerd names a container's image; `fallback` (what the
        request named, an image ID from a kubelet) once the image is gone."""
        rec = self._store.get(IMAGE, image_id)
        if not isinstance(rec, dict):
            return fallback
        return (_strings(rec, "repo_tags") or _strings(rec, "repo_digests") or [fallback])[0]

    def list(self, ref: str | None = None) -> builtins.list[Image]:
        if ref:
            img = self.status(ref)
            return [img] if img else []
        return [self._image(iid, r) for iid, r in self._store.items(IMAGE)]

    def image_config(self, image_id: str) -> dict[str, Any]:
        iid = self._resolve(image_id)
        rec = self._store.get(IMAGE, iid) if iid else None
        if not isinstance(rec, dict) or not isinstance(rec.get("config"), dict):
            raise errors.NotFound(f"image {image_id!r} not found (or stored unreadable)")
        config: dict[str, Any] = rec["config"]
        return config

    # ---- remove ------------------------------------------------------------------------

    async def remove(self, ref: str) -> None:
        """Remove the image `ref` names with all its tags; absent is success."""
        iid = self._resolve(ref)
        if iid is None:
            return
        self._store.delete(IMAGE, iid)
        self._warned.discard(iid)
        self._reindex()
        await self._sweep(wait=False)

    # ---- accounting and recovery -------------------------------------------------------

    def _check_rows(self) -> None:
        """Each stored row checked by its type (rows.py), once, at start; one that fails
        is logged with its key and reason (never its contents) and made again from the
        disk where it can be: a layer's sizes counted again; an image set aside and
        found again in the content store (without its tags); a snapshot set aside and
        held again by the image its container was made from, so its rootfs stays until
        the container goes."""
        for chain, rec in self._store.items(LAYER):
            if why := _problem(rows.check_layer, chain, rec):
                self._recount(chain, rec, why)
        lost = 0
        for iid, rec in self._store.items(IMAGE):
            if why := _problem(rows.check_image, iid, rec):
                log.error("%s; set aside", why)
                self._store.set_aside(IMAGE, iid)
                lost += 1
        if lost:
            found = self.rebuild({}, ())
            log.warning("%d image record(s) set aside; %d image(s) found again in the content "
                        "store, listed by ID until a pull names them", lost, found)
        for key, rec in self._store.items(SNAPSHOT):  # after the images they are held by
            if why := _problem(rows.check_snapshot, key, rec):
                log.error("%s; set aside, and held again by its image", why)
                self._store.set_aside(SNAPSHOT, key)
                self._hold_again(key, rec)

    def _recount(self, chain: str, rec: Record, why: str) -> None:
        """A damaged layer row: the layer on disk says its sizes again."""
        if not (self._layers / chain).is_dir():
            return  # deleted by recover() with the other rows of absent layers
        used, inodes = disk_usage(self._layers / chain)
        log.warning("%s; its size was counted again from disk", why)
        diff_id = rec.get("diff_id")
        self._store.put(LAYER, chain, {"diff_id": diff_id if isinstance(diff_id, str) else "",
                                       "bytes": used, "inodes": inodes})

    def _hold_again(self, key: str, rec: Record) -> None:
        iid = rec.get("image_id")
        image = self._store.get(IMAGE, iid) if isinstance(iid, str) else None
        held = {"image_id": iid, "chain_ids": image["chain_ids"]} if image else {
            "image_id": "", "chain_ids": []}
        self._store.put(SNAPSHOT, key, {**held, "view": rec.get("view") is True})

    def fs_info(self) -> FsUsage:
        """Image filesystem usage from the records (no tree walk on this periodic call)."""
        used = inodes = 0
        for digest in self.content.digests():
            used += self.content.size(digest)
            inodes += 1
        for _, rec in self._store.items(LAYER):  # counts, as recover() leaves them
            used += rec["bytes"] if _count(rec.get("bytes")) else 0
            inodes += rec["inodes"] if _count(rec.get("inodes")) else 0
        return FsUsage(time.time_ns(), str(self.root), used, inodes)

    def recover(self) -> None:
        """Reconcile records and disk after a restart or crash; never touches live mounts."""
        self.content.recover()
        for p in list(self._tmp.iterdir()):
            shutil.rmtree(p, ignore_errors=True)
        self._check_rows()
        for chain, _ in self._store.items(LAYER):
            if not (self._layers / chain).is_dir():
                self._store.delete(LAYER, chain)
        for iid, rec in self._store.items(IMAGE):
            # Only unpacked layers matter for running it: a layer blob may never have been
            # fetched (its chain was already unpacked for another image) or swept since.
            broken = [c for c in _strings(rec, "chain_ids") if self._store.get(LAYER, c) is None]
            if broken:
                log.warning("image %s lost content on disk (%s); dropping it", iid, broken[0])
                self._store.delete(IMAGE, iid)
        for key, _ in self._store.items(SNAPSHOT):
            if not self.snapshots.dir(key).is_dir():
                self._store.delete(SNAPSHOT, key)
        for key in self.snapshots.list_keys():
            if self._store.get(SNAPSHOT, key) is None:
                rootfs = self.snapshots.dir(key) / "rootfs"
                if rootfs.exists() and is_mounted(rootfs):
                    _umount(rootfs)
                self.snapshots.drop_idmapped_store(key)
                shutil.rmtree(self.snapshots.dir(key), ignore_errors=True)
        for chain, _ in self._store.items(LAYER):
            self.snapshots.link_layer(chain)
        for t in self._mark_and_move():
            shutil.rmtree(t, ignore_errors=True)
        self._reindex()


def _problem(check: Callable[[str, Record], None], rid: str, rec: Record) -> str:
    """What is wrong with a row ("" if nothing): its key and reason, never its contents."""
    try:
        check(rid, rec)
    except (TypeError, ValueError) as e:
        return str(e)
    return ""
