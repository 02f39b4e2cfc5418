"""UpdatePodSandboxResources: the pod's recorded resources, and its own pod cgroup."""

from __future__ import annotations

import asyncio
import logging

from pycri.api import api_pb2 as pb
from pycri.errors import FailedPrecondition, NotFound, step
from pycri.oci import spec
from pycri.sandbox import podcgroup
from pycri.sandbox.base import SandboxBase
from pycri.store.sandbox import Sandbox

log = logging.getLogger(__name__)


class Resize(SandboxBase):
    async def update_resources(
        self, sid: str, overhead: pb.LinuxContainerResources | None,
        resources: pb.LinuxContainerResources | None,
    ) -> None:
        """UpdatePodSandboxResources: the pod's overhead and resources become these (an
        absent one is cleared, as containerd records it). Recorded in the pod's config
        in every case; written to the pod cgroup only when it is pycri's own
        (podcgroup.py), as at RunPodSandbox: a kubelet's cgroup_parent is the kubelet's
        to resize, and a pod that started without a pod cgroup has its containers in
        none to bound. A limit the kernel refuses leaves the old ones, and the record,
        as they were."""
        async with self.sandboxes.held(sid) as sb:
            if sb is None:
                raise NotFound(f"pod sandbox {sid!r} not found")
            async with step("NRI UpdatePodSandbox"):
                await self.nri.update_pod_sandbox(sb, overhead, resources)
            config = pb.PodSandboxConfig()
            config.CopyFrom(sb.config)
            for name, value in (("overhead", overhead), ("resources", resources)):
                config.linux.ClearField(name)
                if value is not None:
                    getattr(config.linux, name).CopyFrom(value)
            old = sb.config
            if sb.own_cgroup:
                try:
                    await asyncio.to_thread(podcgroup.update, sb.cgroup_parent,
                                            spec.pod_limits(config.linux))
                except OSError as e:
                    await self._restore_pod_limits(sb)
                    raise FailedPrecondition(
                        f"pod {sb.id}: the kernel refused the new pod-level limits "
                        f"({e.filename}: {e.strerror}); the old ones stay") from None
            elif spec.pod_limits(config.linux):
                log.info("pod %s: new pod-level limits recorded, not written: %s", sb.id,
                         "its cgroup_parent is the kubelet's" if sb.cgroup_parent
                         else "it has no pod cgroup of pycri's own")
            sb.config = config
            try:
                self.sandboxes.save(sb)
            except BaseException:
                sb.config = old
                if sb.own_cgroup:
                    await self._restore_pod_limits(sb)
                raise
        await self.nri.post_update_pod_sandbox(sb)

    async def _restore_pod_limits(self, sb: Sandbox) -> None:
        """Write the recorded limits back over a resize that did not complete."""
        try:
            await asyncio.to_thread(podcgroup.update, sb.cgroup_parent,
                                    spec.pod_limits(sb.config.linux))
        except OSError as e:
            log.error("pod %s: its recorded limits could not be restored: %s", sb.id, e)
