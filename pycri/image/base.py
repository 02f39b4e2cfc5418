"""The image manager's shared state: the content store, the snapshotter, the records
and their index, what running pulls hold, and the mark-and-sweep that reclaims disk
from those records. The other modules of the package are mixins over ImageBase, one
story each (see manager.py).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import re
import shutil
import uuid
from collections import Counter
from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from pycri import errors
from pycri.config import ImagesConfig
from pycri.image import reference, schema
from pycri.image.content import ContentStore
from pycri.image.progress import Progress
from pycri.image.snapshots import Snapshotter
from pycri.store.db import Record, Store

if TYPE_CHECKING:  # the registry client (httpx) is imported on the first pull, not at start
    from pycri.image.registry import RegistryClient

IMAGE, LAYER, SNAPSHOT = "image", "image_layer", "image_snapshot"
_HEX = re.compile(r"^[0-9a-f]{1,64}$")


def _strings(rec: Record, key: str) -> builtins.list[str]:
    """A list-of-strings field of a stored record; anything else reads as empty, and
    strings protobuf cannot carry are dropped, so one record written by an older pycri
    (or damaged) cannot break a list or a sweep."""
    value = rec.get(key) if isinstance(rec, dict) else None
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, str) and schema.is_text(v)]


def _count(value: object) -> TypeGuard[int]:
    """Whether a stored size or count is one: a non-negative int (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _rmtrees(paths: Iterable[Path]) -> None:
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)


def _make_client(cfg: ImagesConfig) -> RegistryClient:
    from pycri.image.registry import RegistryClient

    return RegistryClient(cfg)


class ImageBase:
    """The attributes every mixin of ImageManager shares, declared once so mypy checks
    each mixin against them."""

    def __init__(
        self, root: Path, cfg: ImagesConfig, store: Store, pinned: Iterable[str] = ()
    ) -> None:
        self.root = root
        self._cfg = cfg
        self._store = store
        self.content = ContentStore(root / "content")
        self._layers = root / "layers"
        self._tmp = root / "tmp"
        self._tmp.mkdir(parents=True, exist_ok=True)
        self.snapshots = Snapshotter(root / "snapshots", self._layers, root / "l", root / "empty")
        self._client: RegistryClient | None = None
        self._sem = asyncio.Semaphore(cfg.max_concurrent_downloads)
        # Shared work (a pull, a download, an unpack) by key, and how many wait for each.
        self._inflight: dict[Hashable, asyncio.Task[Any]] = {}
        self._waiters: Counter[asyncio.Task[Any]] = Counter()
        self._held: Counter[str] = Counter()
        self.progress = Progress()  # what the pulls in flight are doing
        self._pinned: set[str] = set()
        # Bumped on every change of what ImageStatus and ListImages answer (the records,
        # their index, the pinned set): the servicer's encoded answers hold until then.
        self.generation = 0
        self.set_pinned(pinned)
        self._by_ref: dict[str, str] = {}
        self._warned: set[str] = set()  # records already reported as unreadable
        # Trash removed after the call that made it has returned (`_sweep`).
        self._to_reap: builtins.list[Path] = []
        self._reaping: asyncio.Task[None] | None = None
        self._reindex()

    @property
    def client(self) -> RegistryClient:
        if self._client is None:
            self._client = _make_client(self._cfg)
        return self._client

    async def connect(self) -> None:
        """Make the registry client in a worker thread, once: importing httpx and
        loading the system's CA store held the event loop for ~0.2 s on a node's
        first pull, and every other call with it."""
        if self._client is None:
            client = await asyncio.to_thread(_make_client, self._cfg)
            if self._client is None:
                self._client = client
            else:  # another pull made one meanwhile
                await client.aclose()

    async def close(self) -> None:
        await self.reaped()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ---- index -------------------------------------------------------------------------

    def _reindex(self) -> None:
        by_ref: dict[str, str] = {}
        for iid, rec in self._store.items(IMAGE):
            for r in _strings(rec, "repo_tags") + _strings(rec, "repo_digests"):
                by_ref[r] = iid
        self._by_ref = by_ref
        self.generation += 1

    def _resolve(self, ref: str) -> str | None:
        """Image ID for an ID, full or unique-prefix hex, tag or digest reference."""
        if ref.startswith("sha256:") and self._store.get(IMAGE, ref):
            return ref
        if len(ref) == 64 and self._store.get(IMAGE, "sha256:" + ref):
            return "sha256:" + ref
        with contextlib.suppress(errors.InvalidArgument):
            iid = self._by_ref.get(str(reference.parse(ref)))
            if iid:
                return iid
        if _HEX.match(ref):
            found = [i for i, _ in self._store.items(IMAGE) if i[7:].startswith(ref)]
            if len(found) == 1:
                return found[0]
        return None

    def _in_use(self, image_id: str) -> bool:
        return any(r.get("image_id") == image_id for _, r in self._store.items(SNAPSHOT))

    def _unpacked_size(self, chains: Iterable[str]) -> int:
        """Disk the image's layers take once unpacked: what it costs a node to hold it."""
        total = 0
        for chain in chains:
            rec = self._store.get(LAYER, chain)
            n = rec.get("bytes") if rec else None
            total += n if _count(n) else 0
        return total

    def set_pinned(self, refs: Iterable[str]) -> None:
        """The images the config names (the pause image): reported pinned to the kubelet,
        so its image GC leaves them; replaced on reload."""
        pinned = set()
        for ref in refs:
            with contextlib.suppress(errors.InvalidArgument):
                pinned.add(str(reference.parse(ref)))
        self._pinned = pinned
        self.generation += 1

    # ---- garbage collection ------------------------------------------------------------

    def _mark_and_move(self) -> builtins.list[Path]:
        """Move unreferenced blobs and layers aside (synchronous, so no pull can interleave)."""
        blobs: set[str] = set(self._held)
        chains: set[str] = set(self._held)
        for _, rec in self._store.items(IMAGE):
            blobs.update(_strings(rec, "blobs"))
            chains.update(_strings(rec, "chain_ids"))
        for _, rec in self._store.items(SNAPSHOT):
            chains.update(_strings(rec, "chain_ids"))
        trash: builtins.list[Path] = []
        for digest in list(self.content.digests()):
            if digest not in blobs:
                self.content.delete(digest)
        for chain, _ in self._store.items(LAYER):
            if chain not in chains:
                self._store.delete(LAYER, chain)
        for d in list(self._layers.iterdir()):
            if d.name not in chains or self._store.get(LAYER, d.name) is None:
                if d.name in self._held:
                    continue
                self.snapshots.unlink_layer(d.name)
                t = self._tmp / f"trash-{uuid.uuid4().hex}"
                os.rename(d, t)
                trash.append(t)
        return trash

    async def _sweep(self, wait: bool = True) -> None:
        """Drop what nothing holds. Unless `wait`, the files go after the call returns:
        moved into tmp/ they are out of every view already, a later removal of the
        same layer is another name, and a restart empties tmp/ (RemoveImage: on this
        machine's ext4 unlinking an image's files is most of the call's time)."""
        trash = self._mark_and_move()
        if not trash:
            return
        if wait:
            await asyncio.to_thread(_rmtrees, trash)
            return
        self._to_reap += trash
        if self._reaping is None or self._reaping.done():
            self._reaping = asyncio.create_task(self._reap())

    async def _reap(self) -> None:
        while self._to_reap:
            batch, self._to_reap = self._to_reap, []
            await asyncio.to_thread(_rmtrees, batch)

    async def reaped(self) -> None:
        """Return once the trash of earlier calls is gone from the disk."""
        while self._reaping is not None and not self._reaping.done():
            await asyncio.wait([self._reaping])
