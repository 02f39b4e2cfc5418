"""Checkpoint and restore of containers and pods with CRIU, through the OCI runtime.

CheckpointContainer pauses the container, dumps it with `runtime checkpoint
--leave-running` (a checkpoint is a copy, as in CRI-O and containerd: the container
runs on), copies its rootfs changes, resumes it, and writes the archive in one piece
(criu/archive.py). CreateContainer whose image is an archive makes a container
from it in the given pod; StartContainer then restores the processes (`runtime restore`
under conmon) instead of starting them. CheckpointPod and RestorePod do the same for
every container of a pod. The work happens in a directory under the daemon's root,
removed whatever the outcome; runtime calls are async subprocesses, file work runs in
worker threads.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import platform
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message

from pycri.api import api_pb2 as pb
from pycri.container.manager import ContainerManager
from pycri.criu import archive
from pycri.criu.support import CheckpointSupport, is_checkpoint_archive
from pycri.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from pycri.gate import check_request
from pycri.sandbox.manager import SandboxManager
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox

FORMAT_VERSION = 1  # of pycri.container.json and pod.options
# Mark an OCI image whose layer is a container's checkpoint layout (`checkpointctl build`
# writes the first, CRI-O's buildah recipe the second).
CHECKPOINT_ANNOTATIONS = ("org.criu.checkpoint.container.name",
                          "io.kubernetes.cri-o.annotations.checkpoint.name")
M = TypeVar("M", bound=Message)


def _rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat().replace("+00:00", "Z")


def _parsed(doc: Any, message: M, what: str) -> M:
    """`message` filled from the archived JSON `doc`; InvalidArgument naming `what`."""
    try:
        json_format.ParseDict(doc or {}, message)
    except (json_format.ParseError, TypeError, AttributeError, ValueError) as e:
        raise InvalidArgument(f"{what} is unreadable: {e}") from None
    return message


def restored_config(dump: dict[str, Any], request: pb.ContainerConfig) -> pb.ContainerConfig:
    """What a restored container is: the request's config, as for a container made from
    any image (user, groups, capabilities, seccomp, LSM, namespaces, mounts, devices,
    resources), on the image the checkpoint's rootfs changes apply to. The archive gives
    only that image, and the name and command where the request has none (RestorePod
    without container_configs). A checkpointed container with a mount or device the
    request lacks is refused; its processes' credentials are checked against the spec
    (criu/creds.py)."""
    archived = _parsed(dump.get("config"), pb.ContainerConfig(),
                       "image: the archive's container config")
    if not archived.image.image:
        raise InvalidArgument("image: the archive's container config names no image")
    config = pb.ContainerConfig()
    config.CopyFrom(request)
    config.image.CopyFrom(pb.ImageSpec(image=archived.image.image))
    if not request.metadata.name:
        config.metadata.CopyFrom(archived.metadata)
    if not (request.command or request.args):
        config.command[:], config.args[:] = archived.command, archived.args
        config.working_dir = config.working_dir or archived.working_dir
    missing = [f"mount {m.container_path}" for m in archived.mounts
               if m.container_path not in {r.container_path for r in request.mounts}]
    missing += [f"device {d.container_path}" for d in archived.devices
                if d.container_path not in {r.container_path for r in request.devices}]
    if missing:
        shown = ", ".join(p[:200] for p in missing[:10])
        raise FailedPrecondition(f"image: the checkpointed container had {shown}"
                                 f"{' …' if len(missing) > 10 else ''}, which the request "
                                 "does not grant")
    return config


class CheckpointManager:
    def __init__(
        self, containers: ContainerManager, sandboxes: SandboxManager, support: CheckpointSupport
    ) -> None:
        self.containers = containers
        self.sandboxes = sandboxes
        self.support = support
        self.cfg = containers.cfg.checkpoint
        self.work_root = Path(containers.cfg.root) / "checkpoints"
        self._swept = False

    # -- the checks every RPC makes first -----------------------------------------------

    async def _require(self, sb: Sandbox) -> None:
        await self.support.require(sb.handler)
        if self.sandboxes.userns(sb) is not None:
            raise FailedPrecondition(f"pod {sb.id} has its own user namespace: pycri does not "
                                     "checkpoint or restore such pods")

    @contextlib.asynccontextmanager
    async def _work(self) -> AsyncIterator[Path]:
        """A fresh directory for one dump or restore, removed afterwards. At the first use
        the leftovers of a crash are removed (no work is in flight then)."""
        def make() -> Path:
            if not self._swept:
                shutil.rmtree(self.work_root, ignore_errors=True)
                self._swept = True
            self.work_root.mkdir(parents=True, exist_ok=True, mode=0o700)
            return Path(tempfile.mkdtemp(dir=self.work_root))

        work = await asyncio.to_thread(make)
        try:
            yield work
        finally:
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, work, True))

    # -- checkpoint -------------------------------------------------------------------

    async def checkpoint_container(self, cid: str, location: str, timeout: int) -> None:
        c = self.containers.get(cid)
        target = await asyncio.to_thread(archive.new_archive, self.cfg.archive_dirs, location,
                                         "location")
        await self._require(self.sandboxes.get(c.sandbox_id))
        async with self._work() as work:
            await self._dump(c.id, work, timeout)
            await self._write(target, work)

    async def checkpoint_pod(
        self, sandbox_id: str, output_path: str, container_ids: builtins.list[str]
    ) -> None:
        sb = self.sandboxes.get(sandbox_id)
        chosen = [self.containers.get(cid) for cid in container_ids]
        for c in chosen:
            if c.sandbox_id != sb.id:
                raise InvalidArgument(f"container_ids: {c.id} is not a container of pod {sb.id}")
        if not container_ids:
            chosen = [c for c in self.containers.of_sandbox(sb.id)
                      if c.state == pb.CONTAINER_RUNNING]
        target = await asyncio.to_thread(archive.new_archive, self.cfg.archive_dirs,
                                         output_path, "output_path")
        await self._require(sb)
        if not chosen:
            raise FailedPrecondition(f"pod {sb.id} has no running container to checkpoint")
        async with self._work() as work:
            for c in chosen:  # one after another: each is frozen only for its own dump
                await asyncio.to_thread((work / c.id).mkdir)
                await self._dump(c.id, work / c.id, 0)
            pod = {"config": json_format.MessageToDict(sb.config), "handler": sb.runtime_handler}
            options = {"version": FORMAT_VERSION,
                       "containers": {c.config.metadata.name: c.id for c in chosen}}
            await asyncio.to_thread(archive.write_json, work / archive.POD_DUMP, pod)
            await asyncio.to_thread(archive.write_json, work / archive.POD_OPTIONS, options)
            await self._write(target, work)

    async def _dump(self, cid: str, out: Path, timeout: int) -> None:
        """The container's checkpoint layout in `out`: CRIU's images, its metadata and
        its rootfs changes. Under the container's lock, so it is not stopped meanwhile."""
        async with self.containers.lock(cid):
            c = self.containers.get(cid)
            if c.state != pb.CONTAINER_RUNNING:
                raise FailedPrecondition(f"container {c.id} is not running")
            images = out / archive.CHECKPOINT_DIR
            await asyncio.to_thread(images.mkdir)
            launcher = self.containers.launcher
            runtime = launcher.runtime(c.handler)
            # Frozen from the dump until its files are copied: CRIU records the sizes of
            # the files the processes have open, and a file written meanwhile would no
            # longer match at the restore.
            async with launcher.frozen(c.id, c.handler):
                await runtime.checkpoint(c.id, images, out, self.cfg.criu,
                                         float(timeout) if timeout > 0 else self.cfg.timeout)
                spec = await asyncio.to_thread(launcher.spec, c.id)
                await asyncio.to_thread(self._write_layout, c, runtime.name, spec or {}, out)

    def _write_layout(self, c: Container, runtime: str, spec: dict[str, Any], out: Path) -> None:
        limit = self.cfg.max_archive_bytes
        used = archive.size_of(out)
        if used > limit:
            raise ResourceExhausted(f"container {c.id}: CRIU's images ({used} bytes) exceed "
                                    f"checkpoint.max_archive_bytes ({limit})")
        archive.write_rootfs_diff(self.containers.images.snapshots.upper(c.id), out,
                                  limit - used)
        archive.write_json(out / archive.CONFIG_DUMP, {
            "id": c.id,
            "name": c.config.metadata.name,
            "rootfsImage": c.config.image.image,
            "rootfsImageRef": c.image_id,
            "rootfsImageName": c.config.image.image,
            "runtime": runtime,
            "createdTime": _rfc3339(c.created_at),
            "checkpointedTime": _rfc3339(time.time_ns()),
        })
        archive.write_json(out / archive.SPEC_DUMP, spec)
        archive.write_json(out / archive.STATUS, {
            "CreatedAt": c.created_at, "StartedAt": c.started_at, "FinishedAt": 0,
            "ExitCode": 0, "Pid": c.pid, "Reason": "", "Message": ""})
        archive.write_json(out / archive.CONTAINER_DUMP, {
            "version": FORMAT_VERSION,
            "config": json_format.MessageToDict(c.config),
            "image_id": c.image_id,
            "criu_host": {"kernel": platform.release(), "arch": platform.machine()},
        })

    async def _write(self, target: Path, work: Path) -> None:
        def write() -> None:
            need, st = archive.size_of(work), os.statvfs(target.parent)
            if need > st.f_bavail * st.f_frsize:
                raise ResourceExhausted(f"{target.parent}: {need} bytes needed for the "
                                        "archive, less free")
            archive.write_tar(target, work, self.cfg.max_archive_bytes)

        await asyncio.to_thread(write)

    # -- restore ----------------------------------------------------------------------

    def restores(self, image: str) -> bool:
        """Whether CreateContainer of `image` is a restore: a checkpoint archive named by
        its path (CRI-O's convention), or a pulled image holding a checkpoint (marked
        by one of CHECKPOINT_ANNOTATIONS)."""
        if is_checkpoint_archive(image):
            return True
        found = self.containers.images.status(image)
        return found is not None and any(a in found.annotations for a in CHECKPOINT_ANNOTATIONS)

    async def create_container(
        self, sandbox_id: str, config: pb.ContainerConfig, sandbox_config: pb.PodSandboxConfig
    ) -> str:
        """CreateContainer whose image `restores`: the container is made from the
        checkpoint, and restored by its StartContainer."""
        sb = self.containers.ready_sandbox(sandbox_id)
        ref, limit = config.image.image, self.cfg.max_archive_bytes
        path = None
        if not is_checkpoint_archive(ref) and not self.cfg.restore_from_images:
            raise FailedPrecondition(
                f"image {ref!r} holds a checkpoint, and restoring from images is off on this "
                "node (checkpoint.restore_from_images)")
        if is_checkpoint_archive(ref):
            path = await asyncio.to_thread(archive.existing_archive, self.cfg.archive_dirs,
                                           ref, "image")
        await self._require(sb)
        async with self._work() as work:
            if path is not None:
                await asyncio.to_thread(archive.extract, path, work, limit, "image")
            else:
                await self._copy_from_image(ref, work)
            return await self._create_from(work, sb.id, config, sandbox_config)

    async def _copy_from_image(self, ref: str, work: Path) -> None:
        images = self.containers.images
        found = images.status(ref)
        if found is None:
            raise NotFound(f"image {ref!r} not found; pull it first")
        key = f"checkpoint-{work.name}"
        view = await images.prepare_view(key, found.id)
        try:
            await asyncio.to_thread(archive.copy_layout, view, work,
                                    self.cfg.max_archive_bytes, "image")
        finally:
            await images.remove_view(key)

    async def _create_from(
        self, src: Path, sandbox_id: str, request: pb.ContainerConfig,
        sandbox_config: pb.PodSandboxConfig,
    ) -> str:
        dump = await asyncio.to_thread(archive.read_json, src / archive.CONTAINER_DUMP, "image")
        if not isinstance(dump, dict) or dump.get("version") != FORMAT_VERSION:
            raise InvalidArgument(f"image: {archive.CONTAINER_DUMP} is not pycri's format "
                                  f"version {FORMAT_VERSION}")
        if not await asyncio.to_thread((src / archive.CHECKPOINT_DIR).is_dir):
            raise InvalidArgument(f"image: the archive has no {archive.CHECKPOINT_DIR}/")
        config = restored_config(dump, request)
        # The archive is input like any request: its config passes the same gate.
        check_request(pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config,
                                                sandbox_config=sandbox_config))
        return await self.containers.create(sandbox_id, config, sandbox_config, restore=src)

    async def restore_pod(
        self, checkpoint_path: str, config: pb.PodSandboxConfig, runtime_handler: str,
        container_configs: builtins.list[pb.ContainerConfig],
    ) -> tuple[str, builtins.list[tuple[str, str]]]:
        """A new pod from a pod archive with each container restored and running; the
        pod is removed again if any container fails. (pod ID, [(name, container ID)])."""
        path = await asyncio.to_thread(archive.existing_archive, self.cfg.archive_dirs,
                                       checkpoint_path, "checkpoint_path")
        await self.support.require(self.sandboxes.launcher.handler_name(runtime_handler))
        async with self._work() as work:
            await asyncio.to_thread(archive.extract, path, work, self.cfg.max_archive_bytes,
                                    "checkpoint_path")
            pod_config, handler, members = await asyncio.to_thread(self._read_pod, work, config,
                                                                   runtime_handler)
            sid = await self.sandboxes.run(pod_config, handler)
            restored: builtins.list[tuple[str, str]] = []
            try:
                await self._require(self.sandboxes.get(sid))
                wanted = {c.metadata.name: c for c in container_configs}
                for name, sub in members.items():
                    request = wanted.get(name, pb.ContainerConfig())
                    cid = await self._create_from(work / sub, sid, request, pod_config)
                    restored.append((name, cid))
                    await self.containers.start(cid)
            except BaseException:
                await asyncio.shield(self._undo_pod(sid))
                raise
        return sid, restored

    def _read_pod(
        self, work: Path, config: pb.PodSandboxConfig, runtime_handler: str
    ) -> tuple[pb.PodSandboxConfig, str, dict[str, str]]:
        """The pod to make (the request's config, else the archived one) and its members."""
        pod = archive.read_json(work / archive.POD_DUMP, "checkpoint_path")
        options = archive.read_json(work / archive.POD_OPTIONS, "checkpoint_path")
        if not isinstance(pod, dict) or not isinstance(options, dict) or (
                options.get("version") != FORMAT_VERSION):
            raise InvalidArgument("checkpoint_path: not a pycri pod checkpoint of format "
                                  f"version {FORMAT_VERSION}")
        members = options.get("containers")
        if not isinstance(members, dict) or not members or not all(
                isinstance(v, str) and v.isalnum() for v in members.values()):
            raise InvalidArgument(f"checkpoint_path: {archive.POD_OPTIONS} names no containers")
        if not config.metadata.name:
            config = _parsed(pod.get("config"), pb.PodSandboxConfig(),
                             "checkpoint_path: the pod config")
            # What the archive says of privilege (namespaces, security context, sysctls,
            # cgroup parent) is not taken: only the request grants it.
            config.ClearField("linux")
            check_request(pb.RunPodSandboxRequest(config=config))
        handler = runtime_handler or str(pod.get("handler", ""))
        return config, handler, members

    async def _undo_pod(self, sid: str) -> None:
        with contextlib.suppress(Exception):
            await self.sandboxes.stop(sid)
        await self.sandboxes.remove(sid)
