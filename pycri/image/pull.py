"""The pull pipeline: resolve a reference on mirrors or its registry, pick the host's
platform, fetch and verify blobs, unpack layers (bounded by the free space and the
expansion ratio), and record the image. Concurrent pulls share their downloads and
unpacks (_shared), and the sweep after each drops what a failed one fetched.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import hashlib
import logging
import os
import platform
import time
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, TypeVar

from pycri import errors, malloc, metrics
from pycri.image import reference, schema
from pycri.image.auth import Auth
from pycri.image.base import IMAGE, LAYER, ImageBase, _strings
from pycri.image.pipe import Aborted, Pipe, own_thread
from pycri.image.progress import LOG_EVERY, LayerProgress, PullProgress
from pycri.image.regconf import Endpoint, RegistriesConf
from pycri.image.unpack import Bound, unpack_layer
from pycri.store.db import Record
from pycri.together import in_thread

log = logging.getLogger("pycri.image")

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "armv6l": "arm",
         "i686": "386", "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}
T = TypeVar("T")
# A layer's bytes between its download and its unpack: enough to ride out a burst
# of small files on the disk side without stalling the connection for long.
PIPE_BYTES = 8 << 20


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


async def _log_progress(state: PullProgress) -> None:
    """A line every LOG_EVERY seconds while the pull runs (cancelled at its end)."""
    while True:
        await asyncio.sleep(LOG_EVERY)
        fields = state.fields(time.monotonic())
        log.info("pull of %s: %s, %s of %s bytes, %s layer(s) of %s done", state.reference,
                 fields["phase"], fields["bytes"], fields["total_bytes"], fields["layers_done"],
                 fields["layers"], extra={"fields": fields})


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


class _ImageFault(Exception):
    """An unpack's error on a layer whose digest matched: the image's fault, whichever
    endpoint served it."""

    def __init__(self, error: errors.PycriError) -> None:
        super().__init__(str(error))
        self.error = error


class ImagePull(ImageBase):
    """PullImage: fetch, verify, unpack and record an image."""

    async def pull(self, ref: str, auth: Auth | None = None) -> str:
        """Fetch, verify and unpack `ref`; returns the image ID (config digest). Concurrent
        pulls of one reference with the same credentials are one pull, which ends (its
        connections closed, what it fetched dropped) when its last caller is cancelled."""
        r = reference.parse(ref)
        key = ("pull", str(r), auth)
        if key not in self._inflight:
            running = sum(1 for k in self._inflight if isinstance(k, tuple) and k[0] == "pull")
            if running >= self._cfg.max_concurrent_pulls:
                raise errors.ResourceExhausted(
                    f"{running} pulls are running, the node's bound "
                    "(images.max_concurrent_pulls); try again when one has ended")
        return await self._shared(key, lambda: self._timed_pull(r, auth, key))

    async def _timed_pull(self, r: reference.Reference, auth: Auth | None,
                          key: Hashable) -> str:
        task = asyncio.current_task()  # the shared pull's: its waiters are its clients
        assert task is not None
        state = self.progress.begin(key, str(r), lambda: self._waiters.get(task, 0))
        ticker = asyncio.create_task(_log_progress(state))
        try:
            with metrics.timed(metrics.PULL_SECONDS, metrics.PULL_FAILURES):
                return await self._pull(r, auth, state)
        finally:
            ticker.cancel()
            self.progress.end(key)

    async def _pull(self, r: reference.Reference, auth: Auth | None,
                    state: PullProgress) -> str:
        if auth is not None:
            auth.basic()  # a malformed `auth` field fails before any network traffic
        await self.connect()
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
            state.layers = [self.progress.layer(chain, layer.digest, layer.size)
                            for layer, chain in zip(man.layers, chains, strict=True)]
            state.enter("downloading")
            async with asyncio.TaskGroup() as tg:
                for layer, diff, chain in zip(man.layers, diff_ids, chains, strict=True):
                    tg.create_task(self._ensure_layer(eps, auth, layer, diff, chain))
            blobs = [top, cdigest, *(d.digest for d in man.layers)]
            if mdigest != top:
                blobs.insert(1, mdigest)
            layer_blobs = set() if self._cfg.keep_layer_blobs else {
                d.digest for d in man.layers}
            state.enter("committing")
            iid = self._commit(r, top, cdigest, config, blobs, chains, man.annotations,
                               layer_blobs)
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
                    log.warning("mirror %s for %s failed, trying next: %s", ep.host, r, e)
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
        await self._room_for(digest, size)
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
                    log.warning("blob %s from %s failed (the next endpoint, if any, is "
                                "tried): %s", digest, ep.api_host, e)
                finally:
                    w.abort()
        assert last is not None
        raise last

    async def _ensure_layer(self, eps: builtins.list[Endpoint], auth: Auth | None,
                            layer: schema.Descriptor, diff_id: str, chain: str) -> None:
        if not self._unpacked(chain):
            if self.content.has(layer.digest):  # kept from an earlier pull
                progress = self.progress.layer(chain, layer.digest, layer.size)
                progress.fetched = layer.size  # nothing to fetch: it is unpacking
                await self._shared("unpack:" + chain,
                                   lambda: self._unpack(layer, diff_id, chain))
            else:
                await self._shared("unpack:" + chain,
                                   lambda: self._fetch_layer(eps, auth, layer, diff_id, chain))
        self.progress.layer(chain, layer.digest, layer.size).done = True

    def _unpacked(self, chain: str) -> bool:
        return bool(self._store.get(LAYER, chain)) and (self._layers / chain).is_dir()

    async def _fetch_layer(self, eps: builtins.list[Endpoint], auth: Auth | None,
                           layer: schema.Descriptor, diff_id: str, chain: str) -> None:
        """Download a layer and unpack it as its bytes arrive, from the first endpoint
        that serves its digest; the compressed blob is written only if it is kept."""
        if self._unpacked(chain):
            return
        keep = self._cfg.keep_layer_blobs
        if keep:
            await self._room_for(layer.digest, layer.size)
        last: errors.PycriError | None = None
        progress = self.progress.layer(chain, layer.digest, layer.size)
        async with self._sem:
            for ep in eps:
                progress.restart(ep.api_host)
                try:
                    await self._stream_layer(ep, auth, layer, diff_id, chain, keep, progress)
                    return
                except _ImageFault as f:
                    raise f.error from None  # another endpoint's same bytes would fail alike
                except errors.ResourceExhausted:
                    raise  # our disk, not the registry: another endpoint would not help
                except errors.PycriError as e:
                    last = e
                    log.warning("layer %s from %s failed (the next endpoint, if any, is "
                                "tried): %s", layer.digest, ep.api_host, e)
        assert last is not None
        raise last

    async def _stream_layer(self, ep: Endpoint, auth: Auth | None, layer: schema.Descriptor,
                            diff_id: str, chain: str, keep: bool,
                            progress: LayerProgress) -> None:
        """One try at `ep`. The unpack reads the download through a Pipe; the layer
        appears only after the blob's digest has matched, since the pipe ends (b"")
        only then. An unpack that fails early leaves the download to finish into the
        hash: a blob with the right digest makes its error the image's, a wrong one
        makes it this endpoint's, and the next endpoint is tried."""
        pipe = Pipe(PIPE_BYTES)
        w = self.content.writer(layer.digest, layer.size, keep=keep)
        dest = self._layers / chain

        def unpack() -> tuple[int, int]:
            try:
                return unpack_layer(pipe, dest, self._tmp, diff_id,
                                    self._expansion_bound(layer.size), name=layer.digest[7:])
            finally:
                pipe.close()

        async def feed(chunk: bytes) -> None:
            progress.fetch(len(chunk), time.monotonic())
            await pipe.put(chunk)  # nothing is queued once the unpack has stopped

        progress.read = lambda: pipe.taken

        unpacking = asyncio.ensure_future(own_thread(unpack, f"unpack {layer.digest[7:19]}"))
        try:
            try:
                await self.client.blob(ep, auth, w, feed)
                await in_thread(w.commit)
            except BaseException:
                pipe.fail(Aborted())
                raise
            pipe.finish()
            try:
                used, inodes = await unpacking
            except errors.PycriError as e:  # the blob is the one named: the image is wrong
                raise _ImageFault(e) from None
        finally:
            if not unpacking.done():
                await asyncio.wait([unpacking])
            if not unpacking.cancelled():
                unpacking.exception()  # raised above, or the download's error is the one
            w.abort()
        self._record_layer(chain, diff_id, used, inodes)

    async def _room_for(self, digest: str, size: int) -> None:
        """ResourceExhausted unless a blob of `size` bytes fits in the free space."""
        if size > await asyncio.to_thread(self._free_space):  # statvfs may block (NFS)
            raise errors.ResourceExhausted(
                f"blob {digest} of {size} bytes does not fit in the free space of {self.root} "
                "(less images.free_space_reserve)"
            )

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
        """Unpack a layer whose blob is in the content store."""
        if self._unpacked(chain):
            return
        blob, dest = self.content.path(layer.digest), self._layers / chain
        # Cancelled (no pull waits any more), the thread still ends before the task does,
        # so a layer cannot land after the pull's sweep: a local unpack, bounded in size.
        used, inodes = await in_thread(
            lambda: unpack_layer(blob, dest, self._tmp, diff_id, self._expansion_bound(layer.size))
        )
        self._record_layer(chain, diff_id, used, inodes)

    def _record_layer(self, chain: str, diff_id: str, used: int, inodes: int) -> None:
        self.snapshots.link_layer(chain)
        self._store.put(LAYER, chain, {"diff_id": diff_id, "bytes": used, "inodes": inodes})

    def _commit(self, r: reference.Reference, top: str, config_digest: str,
                config: dict[str, Any], blobs: builtins.list[str],
                chains: builtins.list[str], annotations: dict[str, str],
                dropped: set[str]) -> str:
        """Record the image and move its tag here from whichever image had it. Blobs in
        `dropped` (layers now unpacked, with `keep_layer_blobs` off) are not held by it:
        the sweep after the pull removes them unless another image or pull holds them."""
        iid = config_digest
        tag = f"{r.repository}:{r.tag}" if r.digest is None else None
        dig = f"{r.repository}@{top}"
        old = self._store.get(IMAGE, iid) or {}
        # Rebuilt from what this pull verified; only names and blobs carry over.
        rec: Record = {"id": iid, "repo_tags": _strings(old, "repo_tags"),
               "repo_digests": _strings(old, "repo_digests"),
               "blobs": sorted((set(_strings(old, "blobs")) | set(blobs)) - dropped),
               "chain_ids": chains,
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
