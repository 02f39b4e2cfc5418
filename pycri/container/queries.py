"""What a running container is asked and told: list, verbose status, resource
updates, log reopening, ExecSync.
"""

from __future__ import annotations

import asyncio
import builtins
import json
from collections.abc import Callable
from pathlib import Path

from google.protobuf import json_format

from pycri.api import api_pb2 as pb
from pycri.container.base import RUNNING_STATES, ContainerBase, _to_json
from pycri.errors import FailedPrecondition, NotFound
from pycri.monitor.execsync import ExecResult, exec_sync
from pycri.names import filtered
from pycri.nri import convert
from pycri.nri.resources import to_cri_resources
from pycri.oci import spec
from pycri.store.container import Container


class ContainerQueries(ContainerBase):
    """Reads of the records, and the calls made to a running container."""

    def list(
        self, flt: pb.ContainerFilter | pb.ContainerStatsFilter | None
    ) -> builtins.list[Container]:
        """Created containers matching a ListContainers or ListContainerStats filter."""
        out = [c for c in self.containers.values() if c.state != pb.CONTAINER_UNKNOWN]
        if flt is None:
            return out
        if flt.pod_sandbox_id:
            out = [c for c in out if c.sandbox_id.startswith(flt.pod_sandbox_id)]
        return filtered(out, flt)

    def verbose_info(self, c: Container) -> dict[str, str]:
        info = {
            "sandboxID": c.sandbox_id,
            "pid": c.pid,
            "conmonPid": c.conmon_pid,
            "runtimeHandler": c.handler,
            "imageId": c.image_id,
            "runtimeSpec": self.launcher.spec(c.id),
        }
        return {"info": json.dumps(info)}

    async def update_resources(self, cid: str, resources: pb.LinuxContainerResources) -> None:
        await self.change_resources(cid, lambda _: resources)

    async def change_resources(self, cid: str, change: Callable[
            [pb.LinuxContainerResources], pb.LinuxContainerResources]) -> None:
        """Update to `change(recorded resources)`, computed under the container's lock,
        so changes made at once (NRI plugins' updates) compose instead of one undoing
        another."""
        async with self.containers.held(cid) as c:
            if c is None:
                raise NotFound(f"container {cid!r} not found")
            if c.state not in RUNNING_STATES:
                raise FailedPrecondition(f"container {c.id} is not running")
            recorded = pb.LinuxContainerResources()
            json_format.ParseDict(c.resources, recorded)
            resources = change(recorded)
            own = await self.nri.update_container(c, convert.cri_resources(resources))
            if own is not None:  # what the plugins changed in it
                resources = to_cri_resources(resources, own)
            await self.launcher.runtime(c.handler).update(c.id, spec.resources_to_oci(resources))
            c.resources = json.loads(_to_json(resources))
            self.containers.save(c)
            await self.nri.post_update_container(c)

    async def reopen_log(self, cid: str) -> None:
        c = self.get(cid)
        if c.state != pb.CONTAINER_RUNNING:
            raise FailedPrecondition(f"container {c.id} is not running")
        if not c.log_path:
            return
        await asyncio.to_thread(self._check_log_for_reopen, c)
        await self.launcher.reopen_log(c.id, Path(c.log_path))

    async def exec_sync(self, cid: str, argv: builtins.list[str], timeout: int) -> ExecResult:
        c = self.get(cid)
        if c.state != pb.CONTAINER_RUNNING:
            raise FailedPrecondition(f"container {c.id} is not running")
        return await exec_sync(
            c.id, argv, runtime=self.launcher.runtime(c.handler), timeout=float(timeout),
            work_root=self.exec_root,
        )
