"""Reuse the CRI message built for a record until the record changes.

The kubelet lists pods and containers every second and asks for their status;
rebuilding each message costs ~10 µs of Python per object, reusing it costs a
C-level copy. A record's `revision` is bumped on every save, so a cached
message is never stale, and an entry goes away with its record object.
A record whose message cannot be built is left out of lists (and logged), so one
bad record cannot break ListPodSandbox or ListContainers for the whole node.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Revisioned(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def revision(self) -> int: ...


log = logging.getLogger(__name__)

R = TypeVar("R", bound=Revisioned)
M = TypeVar("M")


class ItemCache(Generic[R, M]):
    def __init__(self, build: Callable[[R], M]) -> None:
        self._build = build
        self._items: dict[str, tuple[int, M]] = {}
        self._broken: dict[str, int] = {}  # id -> revision already logged as unbuildable

    def get(self, record: R) -> M:
        hit = self._items.get(record.id)
        if hit is not None and hit[0] == record.revision:
            return hit[1]
        msg = self._build(record)
        if hit is None:  # first sight of this record: drop the entry when it is collected
            weakref.finalize(record, self._items.pop, record.id, None)
        self._items[record.id] = (record.revision, msg)
        return msg

    def all(self, records: list[R]) -> list[M]:
        """The messages of `records`, skipping any that cannot be built."""
        out = []
        for r in records:
            try:
                out.append(self.get(r))
            except Exception:
                if self._broken.get(r.id) != r.revision:
                    self._broken[r.id] = r.revision
                    log.exception("record %s left out of lists: its message cannot be built",
                                  r.id)
        return out

    def __len__(self) -> int:
        return len(self._items)
