"""StopPodSandbox and RemovePodSandbox: both idempotent, an unknown ID succeeds."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

from pycri import events
from pycri.api import api_pb2 as pb
from pycri.errors import step
from pycri.network import remove_netns
from pycri.network.cache import CorruptEntry
from pycri.oci import mounts, userns
from pycri.sandbox import podcgroup, podfiles
from pycri.sandbox.infra import Infra
from pycri.sandbox.network import pod_network
from pycri.store.sandbox import Sandbox
from pycri.together import all_settled

log = logging.getLogger(__name__)


class Teardown(Infra):
    async def stop(self, sid: str) -> None:
        """Stop containers and infra, tear the network down. Unknown IDs succeed."""
        async with self.sandboxes.held(sid) as sb:
            if sb is not None:
                await self._stop_locked(sb)

    async def _stop_locked(self, sb: Sandbox) -> None:
        # NOTREADY first: no CreateContainer gets past its readiness check after this
        # (so none escapes stop_all), and the infra exit that follows is not a crash.
        if sb.state == pb.SANDBOX_READY:
            sb.state = pb.SANDBOX_NOTREADY
            self.sandboxes.save(sb)
            self._publish(sb, events.STOPPED)
        if self.containers is not None:
            await self.containers.stop_all(sb.id)
        # Plugins hear of it with the containers stopped and the pod still reachable.
        await self.nri.stop_pod_sandbox(sb)
        # The infra holds no network of its own (the namespace is pinned): both at once,
        # and both to their end, so a failed DEL still leaves the infra stopped.
        await all_settled(self._infra_down(sb), self._network_down(sb))
        if sb.netns:
            async with step("removing the network namespace"):
                await remove_netns(sb.netns)
        if (ns := self.userns(sb)) is not None:
            userns.unpin_userns(Path(ns.path))
        shm = self.shm_path(sb)
        if shm is not None:
            podfiles.unmount(shm)

    async def _infra_down(self, sb: Sandbox) -> None:
        async with step("stopping the infra container"):
            await self._kill_infra(sb)  # decides on the runtime's state, not the record

    async def _network_down(self, sb: Sandbox) -> None:
        """CNI DEL, once: a plugin's failure fails the Stop and a later Stop runs it
        again. A damaged cache is no reason to keep the pod: its DEL is rebuilt from the
        record (issue 38), else the kubelet would retry the Stop forever."""
        if sb.host_network or sb.network_torn_down:
            return
        async with step("tearing down the pod network (CNI)"):
            try:
                await self.cni.teardown(pod_network(sb))
            except CorruptEntry as e:
                await self.cni.teardown_rebuilt(pod_network(sb), e)
        sb.network_torn_down = True
        self.sandboxes.save(sb)

    async def remove(self, sid: str) -> None:
        """Stop if needed, then remove containers, infra, files and the record."""
        async with self.sandboxes.held(sid) as sb:
            if sb is None:
                return
            await self._stop_locked(sb)
            if self.containers is not None:
                await self.containers.remove_all(sb.id)
            await self.nri.remove_pod_sandbox(sb)
            async with step("deleting the infra container"):
                await self.launcher.delete(sb.id, sb.handler)
                await asyncio.to_thread(
                    mounts.unstage_all, mounts.rootfs_staging(self.cfg.state, sb.id))
                await self.images.remove_rootfs(sb.id)
            if sb.own_cgroup:
                await asyncio.to_thread(podcgroup.remove, sb.cgroup_parent, sb.id)
            shutil.rmtree(self.pod_dir(sb.id), ignore_errors=True)
            shutil.rmtree(self.state_dir(sb.id), ignore_errors=True)
            self.sandboxes.forget(sb)
            self.sandboxes.release(sb.name, sb.id)
            self._publish(sb, events.DELETED)
        self.sandboxes.unlock(sb.id)
        log.info("pod sandbox %s removed", sb.id)
