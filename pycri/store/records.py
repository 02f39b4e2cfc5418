"""The records of one kind (pods, containers), shared by both managers: written through
to the store (`save`, `forget`) and indexed in memory.

Reads are answered from here, never from SQLite: a record by ID (the mapping itself),
by any unique ID prefix (crictl's), by the pod it belongs to (a pod's status reads its
containers every second, which must not walk the node), and the names reserved for
live objects (a second RunPodSandbox/CreateContainer for the same metadata is refused
while the first exists). Each record has a lock; `held` looks the record up again once
the lock is held, so a caller that waited never acts on a copy another caller removed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Generic, Protocol, TypeVar

from pycri.errors import AlreadyExists, NotFound
from pycri.names import resolve_prefix
from pycri.store.db import Record, Store


class Stored(Protocol):
    """A record: its ID, how many times it was written, and its stored form."""

    @property
    def id(self) -> str: ...

    revision: int

    def to_record(self) -> Record: ...


R = TypeVar("R", bound=Stored)


class Records(Mapping[str, R], Generic[R]):
    """Records by exact ID (the Mapping), unique prefix, pod and reserved name."""

    def __init__(self, what: str, store: Store, kind: str,
                 pod_of: Callable[[R], str] | None = None) -> None:
        self.what = what  # "container", "pod sandbox": how errors name a record
        self._store, self._kind = store, kind
        self._by_id: dict[str, R] = {}
        self._pod_of = pod_of
        self._by_pod: dict[str, dict[str, R]] = {}
        self._names: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def __getitem__(self, rid: str) -> R:
        return self._by_id[rid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    # -- lookup ---------------------------------------------------------------

    def lookup(self, ref: str) -> R:
        """The record `ref` names by ID or unique prefix: NotFound for none,
        InvalidArgument for an ambiguous prefix."""
        r = self._by_id.get(ref)
        return r if r is not None else self._by_id[resolve_prefix(ref, self._by_id, self.what)]

    def find(self, ref: str) -> R | None:
        try:
            return self.lookup(ref)
        except NotFound:
            return None

    def of_pod(self, pod_id: str) -> list[R]:
        return list(self._by_pod.get(pod_id, {}).values())

    # -- change ---------------------------------------------------------------

    def save(self, r: R) -> None:
        """Write `r` through to the store (its revision counts the writes), then index it.
        A new record waits for room on the store's disk (Store.require_room): the last of
        it is for stopping and removing the records there are."""
        if r.id not in self._by_id:
            self._store.require_room()
        r.revision += 1
        self._store.put(self._kind, r.id, r.to_record())
        self.put(r)

    def forget(self, r: R) -> None:
        """Delete `r` from the store and the index (its name stays reserved)."""
        self._store.delete(self._kind, r.id)
        self.drop(r)

    def load(self, build: Callable[[str, Record], R]) -> list[R]:
        """The stored records of this kind, each built by `build` (at start)."""
        return self._store.load(self._kind, build)

    def put(self, r: R) -> None:
        """Index `r` as it is (loaded from the store, or rebuilt in memory)."""
        self._by_id[r.id] = r
        if self._pod_of is not None:
            self._by_pod.setdefault(self._pod_of(r), {})[r.id] = r

    def drop(self, r: R) -> None:
        """Forget `r` (its name stays reserved until `release`)."""
        self._by_id.pop(r.id, None)
        if self._pod_of is not None:
            pod = self._by_pod.get(self._pod_of(r), {})
            pod.pop(r.id, None)
            if not pod:
                self._by_pod.pop(self._pod_of(r), None)

    # -- names ----------------------------------------------------------------

    def reserve(self, name: str, rid: str) -> None:
        holder = self._names.get(name)
        if holder is not None and holder != rid:
            raise AlreadyExists(f"{self.what} name {name!r} is reserved for {holder}")
        self._names[name] = rid

    def release(self, name: str, rid: str) -> None:
        """Release only if `rid` holds it (a late release never frees another's name)."""
        if self._names.get(name) == rid:
            del self._names[name]

    # -- locks ----------------------------------------------------------------

    def lock(self, rid: str) -> asyncio.Lock:
        return self._locks.setdefault(rid, asyncio.Lock())

    def unlock(self, rid: str) -> None:
        """Drop the lock of a record that is gone for good."""
        self._locks.pop(rid, None)

    @contextlib.asynccontextmanager
    async def held(self, ref: str) -> AsyncIterator[R | None]:
        """The record under its lock, looked up again once the lock is held: None if
        the caller before this one removed it."""
        r = self.find(ref)
        if r is None:
            yield None
            return
        async with self.lock(r.id):
            yield self._by_id.get(r.id)
