"""CreateContainer: a CRI request becomes an OCI bundle (rootfs snapshot, image
volumes, staged mounts, a spec from the pure spec generator) and conmon creates the
process; every step is undone if a later one fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from pycri import events
from pycri.api import api_pb2 as pb
from pycri.cdi import names as cdi_names
from pycri.container.base import _to_json
from pycri.container.ocispec import ContainerSpec
from pycri.container.signals import parse_signal, signal_of_cri
from pycri.criu import archive, creds
from pycri.errors import FailedPrecondition, InvalidArgument, NotFound, step
from pycri.image.snapshots import Idmap, resolve_within
from pycri.names import new_id
from pycri.nri.apply import apply_adjustment
from pycri.oci import mounts, spec, userns
from pycri.oci.rootfs import pin_mount_destinations
from pycri.store import beside
from pycri.store.container import KIND, Container
from pycri.store.sandbox import Sandbox

log = logging.getLogger(__name__)


class ContainerCreate(ContainerSpec):
    """The create pipeline: each step registers its undo, so a failure at any step
    leaves no record, snapshot, mount or bundle, and the name free."""

    def ready_sandbox(self, sandbox_id: str) -> Sandbox:
        sb = self.sandboxes.get(sandbox_id)
        if sb.state != pb.SANDBOX_READY:
            raise FailedPrecondition(f"pod sandbox {sb.id} is not ready")
        return sb

    async def create(
        self, sandbox_id: str, config: pb.ContainerConfig, sandbox_config: pb.PodSandboxConfig,
        restore: Path | None = None,
    ) -> str:
        """`restore`: an unpacked checkpoint (criu/archive.py) the container is made
        from: its rootfs changes are applied now, its processes restored at the start."""
        sb = self.ready_sandbox(sandbox_id)
        config = _with_pod_namespaces(config, sb.config)
        _check_mount_maps(config, sb.config)
        image = self.images.status(config.image.image)
        if image is None:
            raise NotFound(f"image {config.image.image!r} not found; pull it first")
        volume_ids = [self._volume_image(m) if m.image.image else "" for m in config.mounts]
        cid = new_id()
        c = Container(
            id=cid,
            sandbox_id=sb.id,
            config=config,
            image_id=image.id,
            image_ref=image.repo_digests[0] if image.repo_digests else image.id,
            handler=sb.handler,
            created_at=time.time_ns(),
            log_path=self._log_path(sb, config, cid),
            resources=json.loads(_to_json(config.linux.resources)),
            mount_image_ids=volume_ids,
        )
        key = c.name_key(sb.config)
        self.containers.reserve(key, cid)
        try:
            async with self.containers.lock(cid), AsyncExitStack() as undo:
                self.containers.save(c)
                undo.callback(self.containers.forget, c)
                doc = await self._build(c, sb, image.config, undo, restore)
                c.state = pb.CONTAINER_CREATED
                self.containers.save(c)
                undo.pop_all()
        except BaseException:
            self.containers.release(key, cid)
            self.containers.unlock(cid)
            raise
        await self.nri.post_create_container(c, doc)
        self._publish(c, events.CREATED)
        log.info("container %s (%s) created in pod %s", cid, config.metadata.name, sb.id)
        return cid

    def _volume_image(self, m: pb.Mount) -> str:
        """The ID of an image volume's image; checked before anything is made."""
        spec.check_image_volume(m)
        image = self.images.status(m.image.image)
        if image is None:
            raise NotFound(f"image {m.image.image!r} of image volume {m.container_path} not "
                           "found; pull it first")
        return image.id

    async def _mount_image_volumes(
        self, c: Container, idmap: Idmap | None, undo: AsyncExitStack
    ) -> dict[str, str]:
        """Read-only views of the image volumes, by their spec.image_volume_key (idmapped
        like the rootfs when the mount has the pod's mappings)."""
        sources: dict[str, str] = {}
        for i, key in c.image_volumes():
            m = c.config.mounts[i]
            view = await self.images.prepare_view(
                key, c.mount_image_ids[i], idmap if spec.is_idmapped(m) else None)
            undo.push_async_callback(self.images.remove_view, key)
            source = resolve_within(view, m.image_sub_path) if m.image_sub_path else view
            sources[spec.image_volume_key(i)] = str(source)
        return sources

    def _stage_mounts(self, c: Container, idmap: Idmap | None) -> dict[str, str]:
        """Host-side copies of the recursively read-only mounts (by spec.rro_key) and of the
        idmapped ones (by spec.idmap_key, read-only too if asked); they live only until
        the runtime has bound them into the container. Runs in a worker thread: stat and
        mount of a host path can block (a hung NFS server)."""
        sources: dict[str, str] = {}
        userns_fd = userns.open_userns(idmap.userns) if idmap else -1
        try:
            for i, m in enumerate(c.config.mounts):
                idmapped = spec.is_idmapped(m)
                if not (m.recursive_read_only or idmapped) or m.image.image:
                    continue
                if m.recursive_read_only:
                    spec.check_recursive_read_only(m)
                host = mounts.validate_host_path(m.host_path)
                target = self.rro_dir(c.id) / str(i)
                if idmapped:  # _check_mount_maps made sure the pod has a user namespace
                    mounts.stage_idmapped(host.path, target, userns_fd, m.recursive_read_only)
                    sources[spec.idmap_key(i)] = str(target)
                else:
                    mounts.stage_recursive_readonly(host.path, target, m.mount_options)
                    sources[spec.rro_key(i)] = str(target)
        finally:
            if userns_fd >= 0:
                os.close(userns_fd)
        return sources

    def _log_path(self, sb: Sandbox, config: pb.ContainerConfig, cid: str) -> str:
        if sb.config.log_directory and config.log_path:
            return str(Path(sb.config.log_directory) / config.log_path)
        return ""

    async def _build(
        self, c: Container, sb: Sandbox, image_config: dict[str, Any], undo: AsyncExitStack,
        restore: Path | None = None,
    ) -> dict[str, Any]:
        """Everything up to the created process; returns the spec it was created with."""
        config = c.config
        async with step("resolving CDI devices"):
            # Spec files are stat'ed (and read when changed): off the loop, before
            # anything is made, so an unknown device leaves nothing behind.
            wanted = [d.name for d in config.CDI_devices]
            wanted += cdi_names.annotation_devices(dict(config.annotations))
            cdi_edits = await asyncio.to_thread(self.cdi.resolve, wanted) if wanted else []
        idmap = self.sandboxes.idmap(sb)
        async with step("preparing the rootfs"):
            rootfs = await self.images.prepare_rootfs(c.id, c.image_id, idmap)
            undo.push_async_callback(self.images.remove_rootfs, c.id)
        if restore is not None:
            async with step("applying the checkpoint's rootfs changes"):
                await asyncio.to_thread(archive.apply_rootfs_diff, restore, rootfs,
                                        self.cfg.checkpoint.max_archive_bytes, "image")
        async with step("mounting image volumes"):
            volumes = await self._mount_image_volumes(c, idmap, undo)
        async with step("staging recursive read-only and idmapped mounts"):
            undo.callback(self._unstage, c)
            volumes |= await asyncio.to_thread(self._stage_mounts, c, idmap)
            runtime_rootfs = rootfs
            if idmap is not None:
                staging = mounts.rootfs_staging(self.cfg.state, c.id)
                undo.callback(mounts.unstage_all, staging)
                runtime_rootfs = await asyncio.to_thread(
                    mounts.stage_rootfs, str(rootfs), staging, idmap.uid, idmap.gid)
        async with step("generating the OCI spec"):
            image = spec.ImageConfig.from_oci(image_config)
            # The pod spec's stop signal (ContainerConfig.stop_signal) over the image's.
            c.stop_signal = signal_of_cri(config.stop_signal) or image.stop_signal
            parse_signal(c.stop_signal)
            user, profile = await asyncio.to_thread(self._read_identity, c, image, rootfs)
            c.uid, c.gid, c.groups = user.uid, user.gid, list(user.additional_gids)
            # Host paths, mountinfo, /dev and the pod's files are read: off the loop.
            doc = await asyncio.to_thread(
                self._spec, c, sb, image, runtime_rootfs, volumes, user, profile,
                self._pid_ns(c, sb), cdi_edits,
            )
        async with step("NRI CreateContainer"):
            undo.push_async_callback(self.nri.undo_create_container, c)
            adjustment = await self.nri.create_container(c, doc)
            if adjustment is not None:
                # CDI devices a plugin names resolve like the request's own (files read:
                # off the loop).
                doc = await asyncio.to_thread(
                    apply_adjustment, doc, adjustment, cdi=self.cdi.inject)
        c.cgroups_path = doc["linux"].get("cgroupsPath", "")
        # After the plugins: the mounts they add are pinned like any other.
        async with step("checking the image's rootfs"):
            await asyncio.to_thread(pin_mount_destinations, str(rootfs), doc)
        if restore is not None:  # the process is restored at the start
            async with step("checking the checkpoint against the request"):
                await asyncio.to_thread(creds.check, restore / archive.CHECKPOINT_DIR, doc)
            async with step("writing the bundle"):
                bundle = await asyncio.to_thread(self.launcher.write_bundle, c.id, doc,
                                                 _beside(c))
                undo.push_async_callback(self.launcher.delete, c.id, c.handler)
                images = bundle / archive.CHECKPOINT_DIR
                await asyncio.to_thread(os.rename, restore / archive.CHECKPOINT_DIR, images)
                c.restore_images = str(images)
            return doc  # the staged mounts stay until the restore binds them
        async with step("creating the container"):
            log_path, made = await asyncio.to_thread(self._monitor_log, c)
            if made:
                undo.push_async_callback(asyncio.to_thread, self._remove_log, c)
            created = await self.launcher.create(
                c.id,
                doc,
                c.handler,
                log_path,
                record=_beside(c),
                tty=config.tty,
                stdin=config.stdin,
                stdin_once=config.stdin_once,
            )
            undo.push_async_callback(self.launcher.delete, c.id, c.handler)
            c.pid, c.conmon_pid, c.pid_start = created.pid, created.conmon_pid, created.start_time
        # The container's mount namespace holds its own copies now; the host's staged
        # copies would only keep the source's mount points busy (EBUSY on rmdir).
        await asyncio.to_thread(self._unstage, c)
        return doc


def _beside(c: Container) -> bytes:
    """The record kept in the bundle, with the rootfs and image volumes it holds."""
    snaps = {c.id: beside.Snapshot(c.image_id, view=False)}
    snaps |= {key: beside.Snapshot(c.mount_image_ids[i], view=True)
              for i, key in c.image_volumes()}
    return beside.encode(KIND, c.id, c.to_record(), snaps)


def _with_pod_namespaces(
    config: pb.ContainerConfig, pod: pb.PodSandboxConfig
) -> pb.ContainerConfig:
    """A container always lives in its pod's network and IPC namespaces, whatever its own
    options say (critest sends none for a container of a host-network pod)."""
    out = pb.ContainerConfig()
    out.CopyFrom(config)
    ns = out.linux.security_context.namespace_options
    pod_ns = pod.linux.security_context.namespace_options
    ns.network, ns.ipc = pod_ns.network, pod_ns.ipc
    if pod_ns.HasField("userns_options"):  # and every container shares the pod's user ns
        ns.userns_options.CopyFrom(pod_ns.userns_options)
    else:
        ns.ClearField("userns_options")
    return out


def _check_mount_maps(config: pb.ContainerConfig, pod: pb.PodSandboxConfig) -> None:
    """An idmapped mount is made with the pod's user namespace, so its mappings must be
    the pod's (the kubelet sends them so); the request gate checked their syntax."""
    maps = spec.pod_id_maps(pod)
    for m in config.mounts:
        if not spec.is_idmapped(m):
            continue
        if maps is None:
            raise InvalidArgument(f"mount {m.container_path}: uid/gid mappings need a pod with "
                                  "its own user namespace")
        got = (tuple(spec.IDMap(x.container_id, x.host_id, x.length) for x in m.uidMappings),
               tuple(spec.IDMap(x.container_id, x.host_id, x.length) for x in m.gidMappings))
        if got != maps:
            raise InvalidArgument(f"mount {m.container_path}: uid/gid mappings must be the "
                                  "pod's user namespace mappings")
