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
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Hashable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pycri import errors, malloc, metrics
from pycri.config import ImagesConfig
from pycri.image import reference, schema
from pycri.image.auth import Auth
from pycri.image.content import ContentStore
from pycri.image.regconf import Endpoint, RegistriesConf
from pycri.image.snapshots import Idmap, Snapshotter, _umount, is_mounted
from pycri.image.types import FsUsage, Image, user_of
from pycri.image.unpack import Bound, disk_usage, unpack_layer
from pycri.store.db import Record, Store
from pycri.together import in_thread

if TYPE_CHECKING:  # the registry client (httpx) is imported on the first pull, not at start
    from pycri.image.registry import RegistryClient

log = logging.getLogger("pycri.image")

IMAGE, LAYER, SNAPSHOT = "image", "image_layer", "image_snapshot"
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "armv6l": "arm",
         "i686": "386", "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}
T = TypeVar("T")
_HEX = re.compile(r"^[0-9a-f]{1,64}$")


def host_platform() -> tuple[str, str, str]:
    machine = platform.machine()
    arch = _ARCH.get(machine, machine)
    variant = {"armv7l": "v7", "armv6l": "v6", "aarch64": "v8"}.get(machine, "")
    return "linux", arch, variant


def chain_ids(diff_ids: list[str]) -> list[str]:
    """OCI chain IDs (hex): chain[0] = diff[0], chain[n] = sha256(chain[n-1] + " " + diff[n])."""
    out: list[str] = []
    prev = ""
    for d in diff_ids:
        prev = d if not prev else "sha256:" + hashlib.sha256(f"{prev} {d}".encode()).hexdigest()
        out.append(prev.split(":", 1)[1])
    return out


def _first_error(eg: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to report for a failed group of pull tasks: the first domain error
    (its message says what is wrong with the image), else the first error at all."""
    leaves: builtins.list[BaseException] = []
    stack: builtins.list[BaseException] = [eg]
    while stack:
        e = stack.pop(0)
        if isinstance(e, BaseExceptionGroup):
            stack[:0] = e.exceptions
        else:
            leaves.append(e)
    return next((e for e in leaves if isinstance(e, errors.PycriError)), leaves[0])


def _strings(rec: Record, key: str) -> builtins.list[str]:
    """A list-of-strings field of a stored record; anything else reads as empty, and
    strings protobuf cannot carry are dropped, so one record written by an older pycri
    (or damaged) cannot break a list or a sweep."""
    value = rec.get(key) if isinstance(rec, dict) else None
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, str) and schema.is_text(v)]


def _rmtrees(paths: Iterable[Path]) -> None:
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)


class ImageManager:
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
        self._pinned: set[str] = set()
        # Bumped on every change of what ImageStatus and ListImages answer (the records,
        # their index, the pinned set): the servicer's encoded answers hold until then.
        self.generation = 0
        self.set_pinned(pinned)
        self._by_ref: dict[str, str] = {}
        self._warned: set[str] = set()  # records already reported as unreadable
        self._reindex()

    @property
    def client(self) -> RegistryClient:
        if self._client is None:
            from pycri.image.registry import RegistryClient

            self._client = RegistryClient(self._cfg)
        return self._client

    async def close(self) -> None:
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

    def _image(self, iid: str, rec: Record) -> Image:
        """The CRI view of a record, built defensively: records are checked when pulled,
        but one stored by an older pycri may hold anything, and it must still be listed
        (so that it can be seen and removed) without breaking the others."""
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

    def set_pinned(self, refs: Iterable[str]) -> None:
        """The images the config names (the pause image): reported pinned to the kubelet,
        so its image GC leaves them; replaced on reload."""
        pinned = set()
        for ref in refs:
            with contextlib.suppress(errors.InvalidArgument):
                pinned.add(str(reference.parse(ref)))
        self._pinned = pinned
        self.generation += 1

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

    # ---- pull --------------------------------------------------------------------------

    async def pull(self, ref: str, auth: Auth | None = None) -> str:
        """Fetch, verify and unpack `ref`; returns the image ID (config digest). Concurrent
        pulls of one reference with the same credentials are one pull, which ends (its
        connections closed, what it fetched dropped) when its last caller is cancelled."""
        r = reference.parse(ref)
        return await self._shared(("pull", str(r), auth), lambda: self._timed_pull(r, auth))

    async def _timed_pull(self, r: reference.Reference, auth: Auth | None) -> str:
        with metrics.timed(metrics.PULL_SECONDS, metrics.PULL_FAILURES):
            return await self._pull(r, auth)

    async def _pull(self, r: reference.Reference, auth: Auth | None) -> str:
        if auth is not None:
            auth.basic()  # a malformed `auth` field fails before any network traffic
        conf = RegistriesConf.load(self._cfg.registries_conf, self._cfg.registries_conf_dir)
        endpoints = conf.endpoints(r)
        held: builtins.list[str] = []

        def hold(key: str) -> None:
            self._held[key] += 1
            held.append(key)

        try:
            data, mtype, top, ep = await self._top_manifest(endpoints, r, auth)
            hold(top)
            eps = [ep] + [e for e in endpoints if e != ep]
            doc, mdigest = schema.parse_json(data, f"manifest of {r}"), top
            from pycri.image.registry import DOCKER_LIST, OCI_INDEX

            if schema.is_index(mtype, doc, (OCI_INDEX, DOCKER_LIST)):
                mdigest = self._choose_platform(doc, r)
                hold(mdigest)
                await asyncio.to_thread(self.content.put, top, data)
                if self.content.has(mdigest):
                    data = await asyncio.to_thread(self.content.read, mdigest)
                else:
                    data, _, _ = await self.client.manifest(ep, mdigest, auth, expected=mdigest)
                what = f"manifest {mdigest} of {r}"
                man = schema.manifest(schema.parse_json(data, what), what)
                await asyncio.to_thread(self.content.put, mdigest, data)
            else:
                man = schema.manifest(doc, f"manifest of {r}")
                await asyncio.to_thread(self.content.put, top, data)
            cdigest = man.config.digest
            hold(cdigest)
            await self._ensure_blob(eps, auth, cdigest, man.config.size)
            raw = await asyncio.to_thread(self.content.read, cdigest)  # up to 4 MiB from disk
            config = schema.parse_json(raw, f"{r}: image config")
            diff_ids = schema.image_config(config, f"{r}: image config", len(man.layers))
            chains = chain_ids(diff_ids)
            for layer, chain in zip(man.layers, chains, strict=True):
                hold(layer.digest)
                hold(chain)
            async with asyncio.TaskGroup() as tg:
                for layer, diff, chain in zip(man.layers, diff_ids, chains, strict=True):
                    tg.create_task(self._ensure_layer(eps, auth, layer, diff, chain))
            blobs = [top, cdigest, *(d.digest for d in man.layers)]
            if mdigest != top:
                blobs.insert(1, mdigest)
            iid = self._commit(r, top, cdigest, config, blobs, chains, man.annotations)
        except BaseExceptionGroup as eg:  # a layer task failed: report its error, not the group
            raise _first_error(eg) from None
        finally:
            # Shared work this pull alone waited for has ended (_shared); what others
            # still wait for is held by them, so the sweep leaves it.
            for key in held:
                self._held[key] -= 1
                if self._held[key] <= 0:
                    del self._held[key]
            await self._sweep()  # on failure this drops what the pull fetched
            malloc.release()  # the pull's buffers are free now; give the pages back
        return iid

    async def _top_manifest(
        self, endpoints: builtins.list[Endpoint], r: reference.Reference, auth: Auth | None
    ) -> tuple[bytes, str, str, Endpoint]:
        """Try mirrors in order, then the registry; the last error wins if all fail."""
        last: errors.PycriError | None = None
        for ep in endpoints:
            try:
                data, mtype, digest = await self.client.manifest(ep, r.object, auth, r.digest)
                return data, mtype, digest, ep
            except errors.PycriError as e:
                if ep.mirror:
                    log.info("mirror %s for %s failed, trying next: %s", ep.host, r, e)
                last = e
        assert last is not None
        from pycri.image.registry import ManifestNotFound

        if isinstance(last, ManifestNotFound):
            raise errors.NotFound(f"image {r} not found: {last}")
        raise last

    def _choose_platform(self, index: dict[str, Any], r: reference.Reference) -> str:
        os_, arch, variant = host_platform()
        best: tuple[int, str] | None = None
        for d, p in schema.index_entries(index, f"{r}: index"):
            if p.os != os_ or p.architecture != arch:
                continue
            score = 2 if p.variant == variant else (1 if not p.variant else 0)
            if score and (best is None or score > best[0]):
                best = (score, d.digest)
        if best is None:
            raise errors.NotFound(f"image {r}: no manifest for platform {os_}/{arch}")
        return best[1]

    async def _shared(self, key: Hashable, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run `make` once per key at a time; concurrent callers wait for the same work.
        It lives while someone waits for it: the last waiter to leave (its client gone,
        or a sibling layer of its pull failed) cancels it and waits for its cleanup."""
        task: asyncio.Task[T] | None = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(make())
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._settled, key))
        self._waiters[task] += 1
        try:
            return await asyncio.shield(task)
        finally:
            self._waiters[task] -= 1
            if not self._waiters[task]:
                del self._waiters[task]
                if not task.done():
                    self._settled(key, task)  # a new caller starts afresh, not cancelled
                    task.cancel()
                    await asyncio.wait([task])

    def _settled(self, key: Hashable, task: asyncio.Task[Any]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the waiters report it

    async def _ensure_blob(self, eps: builtins.list[Endpoint], auth: Auth | None, digest: str,
                           size: int) -> None:
        if self.content.has(digest):
            return
        await self._shared(digest, lambda: self._download(eps, auth, digest, size))

    async def _download(self, eps: builtins.list[Endpoint], auth: Auth | None, digest: str,
                        size: int) -> None:
        if size > await asyncio.to_thread(self._free_space):  # statvfs may block (NFS)
            raise errors.ResourceExhausted(
                f"blob {digest} of {size} bytes does not fit in the free space of {self.root} "
                "(less images.free_space_reserve)"
            )
        last: errors.PycriError | None = None
        async with self._sem:
            for ep in eps:
                w = self.content.writer(digest, size)
                try:
                    await self.client.blob(ep, auth, w)
                    w.commit()
                    return
                except errors.ResourceExhausted:
                    raise  # our disk, not the registry: another mirror would not help
                except errors.PycriError as e:
                    last = e
                    log.info("blob %s from %s failed: %s", digest, ep.api_host, e)
                finally:
                    w.abort()
        assert last is not None
        raise last

    async def _ensure_layer(self, eps: builtins.list[Endpoint], auth: Auth | None,
                            layer: schema.Descriptor, diff_id: str, chain: str) -> None:
        if self._store.get(LAYER, chain) and (self._layers / chain).is_dir():
            return
        await self._ensure_blob(eps, auth, layer.digest, layer.size)
        await self._shared("unpack:" + chain, lambda: self._unpack(layer, diff_id, chain))

    def _free_space(self) -> int:
        """Bytes pycri may still fill on the image filesystem (a reserve stays for others)."""
        st = os.statvfs(self._tmp)
        return max(st.f_bavail * st.f_frsize - self._cfg.free_space_reserve, 0)

    def _expansion_bound(self, compressed: int) -> Bound:
        """How much a layer of `compressed` bytes may unpack to (see ImagesConfig)."""
        cfg = self._cfg
        limit = max(int(compressed * cfg.max_layer_expansion_ratio), cfg.min_layer_unpacked_bytes)
        free = self._free_space()
        if free < limit:
            return Bound(free, f"the free space of {self.root} less "
                         "images.free_space_reserve", exhausted=True)
        return Bound(limit, f"{cfg.max_layer_expansion_ratio:g} times its {compressed} "
                     "compressed bytes or images.min_layer_unpacked_bytes, whichever is more; "
                     "see images.max_layer_expansion_ratio")

    async def _unpack(self, layer: schema.Descriptor, diff_id: str, chain: str) -> None:
        if self._store.get(LAYER, chain) and (self._layers / chain).is_dir():
            return
        blob, dest = self.content.path(layer.digest), self._layers / chain
        # Cancelled (no pull waits any more), the thread still ends before the task does,
        # so a layer cannot land after the pull's sweep: a local unpack, bounded in size.
        used, inodes = await in_thread(
            lambda: unpack_layer(blob, dest, self._tmp, diff_id, self._expansion_bound(layer.size))
        )
        self.snapshots.link_layer(chain)
        self._store.put(LAYER, chain, {"diff_id": diff_id, "bytes": used, "inodes": inodes})

    def _unpacked_size(self, chains: builtins.list[str]) -> int:
        """Disk the image's layers take once unpacked: what it costs a node to hold it."""
        total = 0
        for chain in chains:
            rec = self._store.get(LAYER, chain)
            n = rec.get("bytes") if rec else None
            total += n if isinstance(n, int) else 0
        return total

    def _commit(self, r: reference.Reference, top: str, config_digest: str,
                config: dict[str, Any], blobs: builtins.list[str],
                chains: builtins.list[str], annotations: dict[str, str]) -> str:
        """Record the image and move its tag here from whichever image had it."""
        iid = config_digest
        tag = f"{r.repository}:{r.tag}" if r.digest is None else None
        dig = f"{r.repository}@{top}"
        old = self._store.get(IMAGE, iid) or {}
        # Rebuilt from what this pull verified; only names and blobs carry over.
        rec: Record = {"id": iid, "repo_tags": _strings(old, "repo_tags"),
               "repo_digests": _strings(old, "repo_digests"),
               "blobs": sorted(set(_strings(old, "blobs")) | set(blobs)), "chain_ids": chains,
               "config": config, "size": self._unpacked_size(chains), "annotations": annotations}
        if tag and tag not in rec["repo_tags"]:
            rec["repo_tags"] = [*rec["repo_tags"], tag]
        if dig not in rec["repo_digests"]:
            rec["repo_digests"] = [*rec["repo_digests"], dig]
        if tag:
            for oid, other in self._store.items(IMAGE):
                tags = _strings(other, "repo_tags")
                if oid == iid or tag not in tags:
                    continue
                other = {**other, "repo_tags": [t for t in tags if t != tag]}
                if not other["repo_tags"] and not _strings(other, "repo_digests") \
                        and not self._in_use(oid):
                    self._store.delete(IMAGE, oid)
                else:
                    self._store.put(IMAGE, oid, other)
        self._store.put(IMAGE, iid, rec)
        self._reindex()
        return iid

    # ---- remove and garbage collection -------------------------------------------------

    async def remove(self, ref: str) -> None:
        """Remove the image `ref` names with all its tags; absent is success."""
        iid = self._resolve(ref)
        if iid is None:
            return
        self._store.delete(IMAGE, iid)
        self._warned.discard(iid)
        self._reindex()
        await self._sweep()

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

    async def _sweep(self) -> None:
        trash = self._mark_and_move()
        if trash:
            await asyncio.to_thread(_rmtrees, trash)

    # ---- root filesystems --------------------------------------------------------------

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
            existing["image_id"] != iid or existing.get("view", False) != readonly
        ):
            raise errors.AlreadyExists(f"snapshot {key!r} exists for image {existing['image_id']}")
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
        img = self._store.get(IMAGE, rec["image_id"])
        unnamed = img is not None and not _strings(img, "repo_tags") \
            and not _strings(img, "repo_digests")
        if unnamed and not self._in_use(rec["image_id"]):
            self._store.delete(IMAGE, rec["image_id"])
            self._reindex()
        await self._sweep()

    def rootfs_usage(self, key: str) -> tuple[int, int]:
        upper = self.snapshots.upper(key)
        if not upper.is_dir():
            raise errors.NotFound(f"rootfs {key!r} not found")
        return disk_usage(upper)

    # ---- accounting and recovery -------------------------------------------------------

    def fs_info(self) -> FsUsage:
        """Image filesystem usage from the records (no tree walk on this periodic call)."""
        used = inodes = 0
        for digest in self.content.digests():
            used += self.content.size(digest)
            inodes += 1
        for _, rec in self._store.items(LAYER):
            used += rec["bytes"]
            inodes += rec["inodes"]
        return FsUsage(time.time_ns(), str(self.root), used, inodes)

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

    def recover(self) -> None:
        """Reconcile records and disk after a restart or crash; never touches live mounts."""
        self.content.recover()
        for p in list(self._tmp.iterdir()):
            shutil.rmtree(p, ignore_errors=True)
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
