"""The checkpoint RPCs' domain side: which objects they name, and whether this node can.

Writing and restoring archives is not built yet: it was developed on a host where CRIU
itself cannot run (see docs/architecture.md), and untested code is not shipped. What is
here gives each RPC the answers the CRI contract needs before any work: NotFound for an
unknown container or pod, FailedPrecondition naming what the node lacks.
"""

from __future__ import annotations

import builtins

from pycri.api import api_pb2 as pb
from pycri.checkpoint.support import NOT_BUILT, CheckpointSupport
from pycri.container.manager import ContainerManager
from pycri.errors import FailedPrecondition, InvalidArgument, Unimplemented
from pycri.sandbox.manager import SandboxManager


class CheckpointManager:
    def __init__(
        self, containers: ContainerManager, sandboxes: SandboxManager, support: CheckpointSupport
    ) -> None:
        self.containers = containers
        self.sandboxes = sandboxes
        self.support = support

    async def checkpoint_container(self, cid: str, location: str, timeout: int) -> None:
        c = self.containers.get(cid)
        await self.support.require(c.handler)
        if c.state != pb.CONTAINER_RUNNING:
            raise FailedPrecondition(f"container {c.id} is not running")
        raise Unimplemented(NOT_BUILT)

    async def checkpoint_pod(
        self, sandbox_id: str, output_path: str, container_ids: builtins.list[str]
    ) -> None:
        sb = self.sandboxes.get(sandbox_id)
        for cid in container_ids:
            if self.containers.get(cid).sandbox_id != sb.id:
                raise InvalidArgument(f"container_ids: {cid} is not a container of pod {sb.id}")
        await self.support.require(sb.handler)
        raise Unimplemented(NOT_BUILT)

    async def restore_pod(self, checkpoint_path: str, runtime_handler: str) -> None:
        await self.support.require(self.sandboxes.launcher.handler_name(runtime_handler))
        raise Unimplemented(NOT_BUILT)
