"""Images found again in the content store, when a damaged database's records are
rebuilt (pycri/rebuild.py, issue 38): before `recover` runs, which would otherwise
sweep every blob and layer no record holds.

An image is each manifest in the content store whose config is there and whose layers
are all unpacked; its ID is its config's digest, as at its pull. What only the lost
records said is not found again: its tags (a pull by tag names it again), and the
repositories of its repo digests, except where a container rebuilt beside it names one
(its `image_ref`). Every document is read bounded, its digest checked, and checked by
the pull's own schema; one that fails is left to the sweep.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
from collections.abc import Iterable, Mapping

from pycri import boundedjson, errors
from pycri.image import reference, schema
from pycri.image.base import IMAGE, LAYER, SNAPSHOT, ImageBase
from pycri.image.pull import chain_ids
from pycri.image.unpack import disk_usage
from pycri.store.beside import Snapshot
from pycri.store.db import Record

MAX_DOCUMENT = schema.MAX_CONFIG  # manifests, indexes and configs are read up to this


class ImageFound(ImageBase):
    """Image, layer and snapshot records made again from the disk."""

    def rebuild(self, snapshots: Mapping[str, Snapshot], refs: Iterable[str]) -> int:
        """Record every whole image in the content store, the layers it holds and the
        `snapshots` (by key) whose directories are still there; `refs` (the repo
        digests rebuilt containers were made from) name the images again where their
        manifest is one of the image's. Returns how many images were found."""
        docs = dict(self._documents())
        images: dict[str, Record] = {}
        for digest, doc in docs.items():
            found = self._image_of(digest, doc, docs)
            if found is None:
                continue
            iid, rec = found
            if self._store.get(IMAGE, iid) is not None:
                continue  # recorded, with its names (one row set aside at a start)
            if iid in images:  # one config under two manifests: one image
                rec["blobs"] = sorted(set(rec["blobs"]) | set(images[iid]["blobs"]))
            images[iid] = rec
        for digest, doc in docs.items():
            if "manifests" not in doc:
                continue
            listed = set(_listed(doc))  # an index: it stays with the images it lists
            for rec in images.values():
                if listed & set(rec["blobs"]):
                    rec["blobs"] = sorted({*rec["blobs"], digest})
        for ref in refs:
            with _unreadable():
                r = reference.parse(ref)
                for rec in images.values():
                    if r.digest in rec["blobs"] and ref not in rec["repo_digests"]:
                        rec["repo_digests"].append(ref)
        for iid, rec in images.items():
            rec["size"] = self._unpacked_size(rec["chain_ids"])
            self._store.put(IMAGE, iid, rec)
        for key, snap in snapshots.items():
            held = images.get(snap.image_id)
            with _unreadable():  # a key Snapshotter.dir refuses, too
                if held is None or not self.snapshots.dir(key).is_dir():
                    continue
                self._store.put(SNAPSHOT, key, {"image_id": snap.image_id,
                                                "chain_ids": held["chain_ids"],
                                                "view": snap.view})
        self._reindex()
        return len(images)

    def _documents(self) -> Iterable[tuple[str, dict[str, object]]]:
        """Each blob that is a JSON object of at most MAX_DOCUMENT bytes and matches its
        digest (a layer is skipped by its size or its first byte)."""
        for digest in list(self.content.digests()):
            with _unreadable():
                path = self.content.path(digest)
                if path.stat().st_size > MAX_DOCUMENT:
                    continue
                data = boundedjson.read_file(path, MAX_DOCUMENT)
                if data.lstrip()[:1] != b"{" or \
                        "sha256:" + hashlib.sha256(data).hexdigest() != digest:
                    continue
                yield digest, schema.parse_json(data, f"blob {digest}")

    def _image_of(self, digest: str, doc: Mapping[str, object],
                  docs: Mapping[str, Mapping[str, object]]) -> tuple[str, Record] | None:
        """The image record a manifest describes, and its layer records made; None if it
        is not a manifest, or not whole on disk."""
        if "layers" not in doc or "config" not in doc:
            return None
        with _unreadable():
            man = schema.manifest(doc, f"manifest {digest}")
            config = docs.get(man.config.digest)
            if config is None:
                return None
            what = f"image config {man.config.digest}"
            diff_ids = schema.image_config(config, what, len(man.layers))
            chains = chain_ids(diff_ids)
            if not all((self._layers / c).is_dir() for c in chains):
                return None
            for chain, diff_id in zip(chains, diff_ids, strict=True):
                if self._store.get(LAYER, chain) is None:
                    used, inodes = disk_usage(self._layers / chain)
                    self._store.put(LAYER, chain, {"diff_id": diff_id, "bytes": used,
                                                   "inodes": inodes})
            blobs = {digest, man.config.digest}
            blobs |= {d.digest for d in man.layers if self.content.has(d.digest)}
            return man.config.digest, {
                "id": man.config.digest, "repo_tags": [], "repo_digests": [],
                "blobs": sorted(blobs), "chain_ids": chains, "config": dict(config),
                "annotations": man.annotations}
        return None


def _listed(index: Mapping[str, object]) -> builtins.list[str]:
    """The digests an index lists, as far as they can be read."""
    out: builtins.list[str] = []
    with _unreadable():
        out = [d.digest for d, _ in schema.index_entries(index, "index")]
    return out


def _unreadable() -> contextlib.suppress:
    """Skip what cannot be read or is not what pycri records (an OSError, a document the
    pull's schema refuses): left to the sweep, as an unreferenced blob is."""
    return contextlib.suppress(OSError, errors.PycriError, ValueError, KeyError, TypeError)
