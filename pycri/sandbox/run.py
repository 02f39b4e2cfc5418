"""RunPodSandbox: every step is undone, in reverse, when a later one fails, and the
error names the step."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from contextlib import AsyncExitStack
from pathlib import Path

from pycri import events
from pycri.api import api_pb2 as pb
from pycri.errors import FailedPrecondition, step
from pycri.names import new_id
from pycri.network import create_netns, remove_netns
from pycri.network.netns import NETNS_RUN_DIR
from pycri.oci import spec, userns
from pycri.sandbox import podcgroup, podfiles
from pycri.sandbox.infra import Infra
from pycri.sandbox.network import pod_network
from pycri.store.sandbox import Sandbox, name_key
from pycri.together import in_thread, sparing

log = logging.getLogger(__name__)


class RunPipeline(Infra):
    def _check_userns_support(self, config: pb.PodSandboxConfig, runtime_handler: str) -> None:
        if spec.pod_id_maps(config) is None:
            return
        support = self.userns_support
        problem = support.problem(runtime_handler) if support else "not probed"
        if problem:
            raise FailedPrecondition(
                f"runtime handler {runtime_handler!r} cannot run pods with their own user "
                f"namespace on this host: {problem}")

    async def run(self, config: pb.PodSandboxConfig, runtime_handler: str) -> str:
        md = config.metadata  # checked by the request gate (gate.py)
        handler = self.launcher.handler_name(runtime_handler)
        # Before the name is reserved: a refusal must leave it free for a retry.
        self._check_userns_support(config, runtime_handler)
        sid = new_id()
        self.sandboxes.reserve(name_key(md), sid)
        sb = Sandbox(
            id=sid,
            config=config,
            handler=handler,
            runtime_handler=runtime_handler,
            created_at=time.time_ns(),
            cgroup_parent=config.linux.cgroup_parent,
        )
        self._running.add(sid)
        try:
            async with self.sandboxes.lock(sid), AsyncExitStack() as undo:
                # Written first, so a crash half-way leaves a NOTREADY pod that
                # StopPodSandbox/RemovePodSandbox can still clean up.
                self.sandboxes.save(sb)
                undo.callback(self.sandboxes.forget, sb)
                await self._setup(sb, undo)
                async with step("NRI RunPodSandbox"):
                    undo.push_async_callback(self.nri.undo_run_pod_sandbox, sb)
                    await self.nri.run_pod_sandbox(sb)
                sb.state = pb.SANDBOX_READY
                self.sandboxes.save(sb)
                undo.pop_all()
        except BaseException:
            self.sandboxes.release(name_key(md), sid)
            self.sandboxes.unlock(sid)
            raise
        finally:
            self._running.discard(sid)
        self._publish(sb, events.CREATED)
        self._publish(sb, events.STARTED)
        log.info("pod sandbox %s (%s/%s) ready, ips %s", sid, md.namespace, md.name, sb.ips)
        return sid

    async def _setup(self, sb: Sandbox, undo: AsyncExitStack) -> None:
        config = sb.config
        pod_dir, state_dir = self.pod_dir(sb.id), self.state_dir(sb.id)
        ns = self.userns(sb)
        idmap = self.idmap(sb)
        owner = (idmap.uid, idmap.gid) if idmap else None
        async with step("writing pod files"):
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            undo.callback(shutil.rmtree, state_dir, True)
            podfiles.write_pod_files(pod_dir, config, sb.host_network, owner)
            undo.callback(shutil.rmtree, pod_dir, True)
        await self._pod_cgroup(sb, undo)
        shm = self.shm_path(sb)
        if shm is not None:
            async with step("mounting /dev/shm"):
                podfiles.mount_shm(shm, owner=owner)
                undo.callback(podfiles.unmount, shm)
        if ns is not None:  # the gate allows no host network with a user namespace
            async with step("creating the pod's user and network namespaces"):
                sb.netns = str(NETNS_RUN_DIR / f"pycri-{sb.id}")
                self.sandboxes.save(sb)
                undo.push_async_callback(remove_netns, sb.netns)
                undo.callback(userns.unpin_userns, Path(ns.path))
                await userns.create_pod_namespaces(
                    Path(ns.path), f"pycri-{sb.id}", ns.uids, ns.gids)
        elif not sb.host_network:
            async with step("creating the network namespace"):
                # Path saved and undo pushed first: a crash or cancel during the create
                # must not leave a pinned namespace nobody knows about.
                sb.netns = str(NETNS_RUN_DIR / f"pycri-{sb.id}")
                self.sandboxes.save(sb)
                undo.push_async_callback(remove_netns, sb.netns)
                await create_netns(f"pycri-{sb.id}")
        # The network and the infra need only the pinned namespace: wired at once. A failed
        # ADD cuts the infra's creation short; a failed infra lets the ADD finish (its
        # plugins are never killed half-way for it), and both are then undone.
        await sparing(self._network_up(sb, undo), self._infra_up(sb, undo, idmap))

    async def _network_up(self, sb: Sandbox, undo: AsyncExitStack) -> None:
        """CNI ADD into the pod's network namespace (none for a host-network pod)."""
        if sb.host_network:
            return
        pod_net = pod_network(sb)
        async with step("setting up the pod network (CNI)"):
            undo.push_async_callback(self.cni.teardown, pod_net)
            result = await self.cni.setup(pod_net)
            sb.ips = list(result.ips)
            podfiles.add_hosts_entry(self.pod_dir(sb.id), sb.ips,
                                     podfiles.pod_hostname(sb.config, sb.host_network))

    async def _pod_cgroup(self, sb: Sandbox, undo: AsyncExitStack) -> None:
        """A pod without a cgroup_parent that sets pod-level limits gets a pod cgroup of
        pycri's own, holding them (podcgroup.py); one the kubelet names is never written."""
        limits = spec.pod_limits(sb.config.linux)
        if not limits or sb.config.linux.cgroup_parent:
            return
        if self.cfg.cgroup_driver != "cgroupfs":
            log.info("pod %s: pod-level limits only reach the handler (annotations): "
                     "pycri makes no pod cgroup under the %s driver", sb.id,
                     self.cfg.cgroup_driver)
            return
        async with step("creating the pod cgroup"):
            sb.cgroup_parent, sb.own_cgroup = podcgroup.path_for(sb.id), True
            # First: a crash during the create leaves it to RemovePodSandbox.
            self.sandboxes.save(sb)
            undo.push_async_callback(asyncio.to_thread, podcgroup.remove, sb.cgroup_parent,
                                     sb.id)
            await in_thread(podcgroup.create, sb.cgroup_parent, limits)
