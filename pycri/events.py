"""Lifecycle events for GetContainerEvents (the kubelet's evented PLEG, `crictl events`).

The managers publish; each subscriber gets its own bounded queue. A reader that
falls behind loses its oldest events rather than slowing the runtime down: the
kubelet relists anyway, events only make it react sooner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from pycri.api import api_pb2 as pb

log = logging.getLogger(__name__)

CREATED = pb.CONTAINER_CREATED_EVENT
STARTED = pb.CONTAINER_STARTED_EVENT
STOPPED = pb.CONTAINER_STOPPED_EVENT
DELETED = pb.CONTAINER_DELETED_EVENT
QUEUE_SIZE = 1000


@dataclass(frozen=True)
class Event:
    object_id: str  # a container's ID, or a sandbox's for its own lifecycle
    sandbox_id: str
    kind: int  # a pb.ContainerEventType value
    created_at: int  # ns since the epoch


class EventBus:
    def __init__(self, queue_size: int = QUEUE_SIZE) -> None:
        self._queue_size = queue_size
        self._subscribers: set[asyncio.Queue[Event]] = set()

    def publish(self, event: Event) -> None:
        for q in self._subscribers:
            if q.full():
                q.get_nowait()
                log.debug("event reader is behind; dropped its oldest event")
            q.put_nowait(event)

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[asyncio.Queue[Event]]:
        q: asyncio.Queue[Event] = asyncio.Queue(self._queue_size)
        self._subscribers.add(q)
        try:
            yield q
        finally:
            self._subscribers.discard(q)
