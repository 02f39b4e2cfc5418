"""The pod's infra process: its spec, its rootfs (the pause image's or an empty
directory), its start through conmon, and its kill."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from pycri.errors import step
from pycri.image.snapshots import Idmap
from pycri.oci import mounts, seccomp, selinux, spec
from pycri.oci.rootfs import pin_mount_destinations
from pycri.oci.users import ResolvedUser
from pycri.sandbox.base import SandboxBase
from pycri.store import beside
from pycri.store.sandbox import KIND, Sandbox
from pycri.together import in_thread

log = logging.getLogger(__name__)

INFRA_STOP_TIMEOUT = 10.0


class Infra(SandboxBase):
    async def _infra_up(self, sb: Sandbox, undo: AsyncExitStack, idmap: Idmap | None) -> None:
        """The infra process: created by conmon, then started."""
        owner = (idmap.uid, idmap.gid) if idmap else None
        image: spec.ImageConfig | None = None
        rootfs = self.pod_dir(sb.id) / "rootfs"
        snapshots: dict[str, beside.Snapshot] = {}
        if self.cfg.pause_image:
            async with step(f"preparing the pause image {self.cfg.pause_image}"):
                undo.push_async_callback(self.images.remove_rootfs, sb.id)  # absent is fine
                image_id, image, rootfs = await self._pause_rootfs(sb, idmap)
                snapshots[sb.id] = beside.Snapshot(image_id, view=False)
        else:
            rootfs.mkdir(exist_ok=True)
            if owner is not None:  # runc makes /proc, /dev, ... in it as the pod's root
                os.chown(rootfs, *owner)
        async with step("starting the infra container"):
            if idmap is not None:
                staging = mounts.rootfs_staging(self.cfg.state, sb.id)
                undo.callback(mounts.unstage_all, staging)
                rootfs = await in_thread(
                    mounts.stage_rootfs, str(rootfs), staging, idmap.uid, idmap.gid)
            spec_doc = await asyncio.to_thread(self._infra_spec, sb, rootfs, image)
            created = await self.launcher.create(
                sb.id, spec_doc, sb.handler, self.state_dir(sb.id) / "infra.log",
                record=beside.encode(KIND, sb.id, sb.to_record(), snapshots))
            undo.push_async_callback(self.launcher.delete, sb.id, sb.handler)
            undo.push_async_callback(self._kill_infra, sb)
            await self.launcher.start(sb.id, sb.handler)
            sb.infra_pid, sb.conmon_pid = created.pid, created.conmon_pid
            sb.infra_start = created.start_time

    async def _pause_rootfs(
        self, sb: Sandbox, idmap: Idmap | None
    ) -> tuple[str, spec.ImageConfig, Path]:
        """The configured pause image's ID and rootfs (pulled on first use; pinned by
        config)."""
        ref = self.cfg.pause_image
        image = self.images.status(ref)
        image_id = image.id if image else await self.images.pull(ref)
        rootfs = await self.images.prepare_rootfs(sb.id, image_id, idmap)
        return image_id, spec.ImageConfig.from_oci(self.images.image_config(image_id)), rootfs

    def _infra_spec(
        self, sb: Sandbox, rootfs: Path, image: spec.ImageConfig | None
    ) -> dict[str, Any]:
        """Runs in a worker thread: it reads the seccomp profile and walks the pause rootfs."""
        config = sb.config
        sc = config.linux.security_context
        uid = sc.run_as_user.value if sc.HasField("run_as_user") else 0
        gid = sc.run_as_group.value if sc.HasField("run_as_group") else 0
        profile = seccomp.load_profile(
            sc.seccomp if sc.HasField("seccomp") else None, sc.seccomp_profile_path
        )
        ctx = spec.SandboxContext(
            sandbox_id=sb.id,
            rootfs=str(rootfs),
            user=ResolvedUser(uid, gid, (gid,)),
            infra_binary=self.cfg.infra_binary,
            image=image,
            net_ns=sb.netns or None,
            shm_path=self.shm_source(sb),
            seccomp=profile,
            cgroup_parent=sb.cgroup_parent,
            cgroup_driver=self.cfg.cgroup_driver,
            min_oom_score_adj=self.min_oom_score_adj,
            available_capabilities=self.capabilities,
            selinux_enabled=self.selinux,
            userns=self.userns(sb),
        )
        if not self.selinux:
            selinux.ignored(f"pod sandbox {sb.id}", selinux.sandbox_fields(config))
        doc = spec.sandbox_spec(config, ctx)
        if image is not None:  # a pause image is as untrusted as any other image
            pin_mount_destinations(str(rootfs), doc)
        return doc

    async def _kill_infra(self, sb: Sandbox) -> None:
        """SIGKILL the infra and wait for conmon's exit report (if the runtime knows it)."""
        if self.launcher.exit_code(sb.id) is not None:
            return
        if await self.launcher.state(sb.id, sb.handler) is None:
            return  # gone with a reboot, or never created
        await self.launcher.kill(sb.id, sb.handler, signal.SIGKILL)
        if not await self.launcher.wait_exit(sb.id, INFRA_STOP_TIMEOUT):
            log.warning("infra of pod %s did not exit within %ss", sb.id, INFRA_STOP_TIMEOUT)
