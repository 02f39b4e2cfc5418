"""RuntimeService GetContainerEvents: lifecycle events as a server stream."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from pycri.api import api_pb2 as pb
from pycri.container.manager import ContainerManager
from pycri.events import Event
from pycri.sandbox.manager import SandboxManager
from pycri.server.container_rpcs import container_status
from pycri.server.sandbox_rpcs import sandbox_status

log = logging.getLogger("pycri.rpc")

Ctx = grpc.aio.ServicerContext


class EventRPCs:
    sandboxes: SandboxManager
    containers: ContainerManager

    def _event_message(self, ev: Event) -> pb.ContainerEventResponse:
        """The event with its pod's status as it is now (absent once the pod is gone)."""
        msg = pb.ContainerEventResponse(
            container_id=ev.object_id,
            container_event_type=ev.kind,  # type: ignore[arg-type]
            created_at=ev.created_at,
        )
        sb = self.sandboxes.sandboxes.get(ev.sandbox_id)
        if sb is not None:
            msg.pod_sandbox_status.CopyFrom(sandbox_status(sb))
            msg.containers_statuses.extend(
                container_status(c) for c in self.containers.known_of_sandbox(sb.id))
        return msg

    async def GetContainerEvents(
        self, request: pb.GetEventsRequest, context: Ctx
    ) -> AsyncIterator[pb.ContainerEventResponse]:
        with self.containers.events.subscribe() as queue:
            while True:
                ev = await queue.get()
                try:
                    msg = self._event_message(ev)
                except Exception:
                    # One unbuildable record must not end every subscriber's stream.
                    log.exception("GetContainerEvents: left out the event of %s", ev.object_id)
                    continue
                yield msg
