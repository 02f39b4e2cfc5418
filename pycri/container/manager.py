"""Container lifecycle: create, start, stop, remove, status, list, update, exec, logs.

CreateContainer turns a CRI request into an OCI bundle (rootfs snapshot + a
spec from the pure spec generator) and has conmon create the process; every
step is undone if a later one fails. Exits arrive from conmon's exit files
through the launcher and are recorded before anyone asks.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from pycri import events
from pycri.api import api_pb2 as pb
from pycri.cdi import names as cdi_names
from pycri.cdi import registry as cdi
from pycri.cdi.schema import ContainerEdits
from pycri.config import Config
from pycri.criu import archive, creds
from pycri.criu.support import CheckpointSupport
from pycri.devices import host_devices, resolve_device
from pycri.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PycriError,
    step,
)
from pycri.events import Event, EventBus
from pycri.image.manager import ImageManager
from pycri.image.snapshots import Idmap, resolve_within
from pycri.launcher import Launcher
from pycri.monitor.cgroupkill import kill_leftovers
from pycri.monitor.execsync import ExecResult, exec_sync, sweep_orphans
from pycri.monitor.probe import Fact, Probe, identity_of
from pycri.names import matches_labels, new_id
from pycri.nri import adjust, convert
from pycri.nri.adaptation import Adaptation
from pycri.nri.api import api_pb2 as nri_api
from pycri.oci import mounts, seccomp, selinux, spec, userns
from pycri.oci.rootfs import pin_mount_destinations
from pycri.oci.users import ResolvedUser, UserRequest, resolve_user_in_rootfs
from pycri.recovery import probed
from pycri.sandbox.manager import SandboxManager
from pycri.store import Store
from pycri.store.container import KIND, Container
from pycri.store.records import Records
from pycri.store.sandbox import Sandbox

log = logging.getLogger(__name__)


KILL_WAIT = 30.0
RUNNING_STATES = (pb.CONTAINER_CREATED, pb.CONTAINER_RUNNING)


def parse_signal(name: str) -> int:
    """An image STOPSIGNAL ("SIGQUIT", "QUIT", "3") as a number; SIGTERM if unset."""
    if not name:
        return signal.SIGTERM
    if name.isdigit():
        return int(name)
    sig = name.upper()
    if not sig.startswith("SIG"):
        sig = "SIG" + sig
    try:
        return int(signal.Signals[sig])
    except KeyError:
        raise InvalidArgument(f"unknown stop signal {name!r}") from None


_RT_PLUS, _RT_MINUS = "SIGRTMINPLUS", "SIGRTMAXMINUS"


def signal_of_cri(value: int) -> str:
    """A CRI `Signal` (ContainerConfig.stop_signal) as the number parse_signal takes;
    "" for RUNTIME_DEFAULT (the image's STOPSIGNAL, else SIGTERM)."""
    if not value:
        return ""
    name = pb.Signal.Name(value).removeprefix("SIGNAL_")
    if name.startswith(_RT_PLUS):
        return str(signal.SIGRTMIN + int(name.removeprefix(_RT_PLUS)))
    if name.startswith(_RT_MINUS):
        return str(signal.SIGRTMAX - int(name.removeprefix(_RT_MINUS)))
    return str(int(signal.Signals[name]))


def cri_signal(signum: int) -> int:
    """The CRI `Signal` of a signal number (ContainerStatus.stop_signal); real-time
    signals by their distance from SIGRTMIN or SIGRTMAX, as the CRI names them."""
    lo, hi = int(signal.SIGRTMIN), int(signal.SIGRTMAX)
    if lo < signum <= lo + 15:
        name = f"{_RT_PLUS}{signum - lo}"
    elif hi - 14 <= signum < hi:
        name = f"{_RT_MINUS}{hi - signum}"
    else:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            return pb.SIGNAL_RUNTIME_DEFAULT
    return pb.Signal.Value(f"SIGNAL_{name}")


class ContainerManager:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        launcher: Launcher,
        sandboxes: SandboxManager,
        images: ImageManager,
        events: EventBus,
    ) -> None:
        self.cfg = cfg
        self.events = events
        self.store = store
        self.launcher = launcher
        self.sandboxes = sandboxes
        self.images = images
        self.nri: Adaptation = sandboxes.nri
        self.containers: Records[Container] = Records("container", lambda c: c.sandbox_id)
        self.log_root = Path(cfg.state) / "logs"
        self.rro_root = mounts.staging_area(cfg.state)
        self._starting: set[str] = set()  # StartContainer in flight
        self._reaping: dict[str, asyncio.Task[int]] = {}  # leftovers being killed
        self.cdi = cdi.Registry(cfg.cdi.spec_dirs, cfg.cdi.max_spec_bytes,
                                cfg.cdi.max_spec_files)
        self.checkpoint_support = CheckpointSupport(cfg)
        self._nri_stops: dict[str, asyncio.Task[None]] = {}  # NRI StopContainer in flight
        self.unchecked: set[str] = set()  # loaded at start, state not rechecked yet

    # -- lookup ------------------------------------------------------------------

    def get(self, cid: str) -> Container:
        return self.containers.lookup(cid)

    def find(self, cid: str) -> Container | None:
        return self.containers.find(cid)

    def lock(self, cid: str) -> asyncio.Lock:
        return self.containers.lock(cid)

    def _save(self, c: Container) -> None:
        c.revision += 1
        self.store.put(KIND, c.id, c.to_record())
        self.containers.put(c)

    def _publish(self, c: Container, kind: int) -> None:
        self.events.publish(Event(c.id, c.sandbox_id, kind, time.time_ns()))

    def _forget(self, c: Container) -> None:
        self.store.delete(KIND, c.id)
        self.containers.drop(c)

    def of_sandbox(self, sandbox_id: str) -> list[Container]:
        return self.containers.of_pod(sandbox_id)

    def known_of_sandbox(self, sandbox_id: str) -> list[Container]:
        """The pod's containers whose state is known: what its status, events and stats
        report (an UNKNOWN one is left out until its recheck)."""
        return [c for c in self.of_sandbox(sandbox_id) if c.state != pb.CONTAINER_UNKNOWN]

    # -- create ------------------------------------------------------------------

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
                self._save(c)
                undo.callback(self._forget, c)
                doc = await self._build(c, sb, image.config, undo, restore)
                c.state = pb.CONTAINER_CREATED
                self._save(c)
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

    def rro_dir(self, cid: str) -> Path:
        return self.rro_root / cid

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

    def _unstage(self, c: Container) -> None:
        mounts.unstage_all(self.rro_dir(c.id))

    def _sweep_staging(self) -> None:
        """At start no create is in flight: every staged copy is a crash's leftover."""
        for staging in self.rro_root.iterdir() if self.rro_root.is_dir() else ():
            log.info("removing staged mounts left by a crash in %s", staging)
            mounts.unstage_all(staging)

    async def _remove_image_volumes(self, c: Container) -> None:
        for _, key in c.image_volumes():
            await self.images.remove_view(key)

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
                    adjust.apply_adjustment, doc, adjustment, cdi=self.cdi.inject)
        c.cgroups_path = doc["linux"].get("cgroupsPath", "")
        # After the plugins: the mounts they add are pinned like any other.
        async with step("checking the image's rootfs"):
            await asyncio.to_thread(pin_mount_destinations, str(rootfs), doc)
        if restore is not None:  # the process is restored at the start
            async with step("checking the checkpoint against the request"):
                await asyncio.to_thread(creds.check, restore / archive.CHECKPOINT_DIR, doc)
            async with step("writing the bundle"):
                bundle = await asyncio.to_thread(self.launcher.write_bundle, c.id, doc)
                undo.push_async_callback(self.launcher.delete, c.id, c.handler)
                images = bundle / archive.CHECKPOINT_DIR
                await asyncio.to_thread(os.rename, restore / archive.CHECKPOINT_DIR, images)
                c.restore_images = str(images)
            return doc  # the staged mounts stay until the restore binds them
        async with step("creating the container"):
            created = await self.launcher.create(
                c.id,
                doc,
                c.handler,
                self._monitor_log(c),
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

    def _monitor_log(self, c: Container) -> Path:
        """Where conmon writes the container's output (made if need be)."""
        log_path = Path(c.log_path) if c.log_path else self.log_root / f"{c.id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        return log_path

    @staticmethod
    def _read_identity(
        c: Container, image: spec.ImageConfig, rootfs: Path
    ) -> tuple[ResolvedUser, dict[str, Any] | None]:
        """The user from the image's passwd/group and the seccomp profile: file reads that
        may block (a FIFO, a slow disk), so they run in a worker thread."""
        sc = c.config.linux.security_context
        user = resolve_user_in_rootfs(
            str(rootfs),
            UserRequest(
                run_as_user=sc.run_as_user.value if sc.HasField("run_as_user") else None,
                run_as_group=sc.run_as_group.value if sc.HasField("run_as_group") else None,
                run_as_username=sc.run_as_username,
                image_user=image.user,
                supplemental_groups=tuple(sc.supplemental_groups),
                strict_groups=sc.supplemental_groups_policy == pb.SupplementalGroupsPolicy.Strict,
            ),
        )
        profile = seccomp.load_profile(
            sc.seccomp if sc.HasField("seccomp") else None, sc.seccomp_profile_path
        )
        return user, profile

    def _spec(
        self,
        c: Container,
        sb: Sandbox,
        image: spec.ImageConfig,
        rootfs: Path,
        volumes: dict[str, str],
        user: ResolvedUser,
        profile: dict[str, Any] | None,
        pid_ns: str | None,
        cdi_edits: builtins.list[ContainerEdits],
    ) -> dict[str, Any]:
        """The container's OCI spec; runs in a worker thread and only reads the records."""
        config = c.config
        sc = config.linux.security_context
        sources = dict(volumes)
        for m in config.mounts:
            if m.image.image:
                continue
            host = mounts.validate_host_path(m.host_path)
            mounts.check_propagation(host.path, m.propagation)
            sources[m.host_path] = host.path
        devices = [d for dev in config.devices for d in resolve_device(dev)]
        ns = sb.config.linux.security_context.namespace_options
        infra = f"/proc/{sb.infra_pid}/ns"
        pod_dir = self.sandboxes.pod_dir(sb.id)
        ctx = spec.ContainerContext(
            container_id=c.id,
            sandbox_id=sb.id,
            rootfs=str(rootfs),
            user=user,
            net_ns=sb.netns or None,
            ipc_ns=f"{infra}/ipc" if ns.ipc != pb.NODE else None,
            uts_ns=f"{infra}/uts" if ns.network != pb.NODE else None,
            pid_ns=pid_ns,
            hostname=(pod_dir / "hostname").read_text().strip(),
            hostname_path=str(pod_dir / "hostname"),
            resolv_conf_path=str(pod_dir / "resolv.conf"),
            hosts_path=str(pod_dir / "hosts"),
            shm_path=self.sandboxes.shm_source(sb),
            seccomp=profile,
            cgroup_parent=sb.cgroup_parent,
            cgroup_driver=self.cfg.cgroup_driver,
            min_oom_score_adj=self.sandboxes.min_oom_score_adj,
            available_capabilities=self.sandboxes.capabilities,
            devices=devices,
            host_devices=host_devices() if sc.privileged else (),
            mount_sources=sources,
            selinux_enabled=self.sandboxes.selinux,
            userns=self.sandboxes.userns(sb),
            cdi_edits=cdi_edits,
        )
        if not self.sandboxes.selinux:
            selinux.ignored(f"container {c.id}", selinux.container_fields(config))
        return spec.container_spec(config, sb.config, image, ctx)

    def _pid_ns(self, c: Container, sb: Sandbox) -> str | None:
        mode = c.config.linux.security_context.namespace_options.pid
        if mode == pb.POD:
            return f"/proc/{sb.infra_pid}/ns/pid"
        if mode == pb.TARGET:
            target_id = c.config.linux.security_context.namespace_options.target_id
            target = self.find(target_id)
            if target is None or target.state != pb.CONTAINER_RUNNING:
                raise NotFound(f"target container {target_id!r} is not running")
            return f"/proc/{target.pid}/ns/pid"
        return None

    # -- start / stop / remove -------------------------------------------------------

    async def start(self, cid: str) -> None:
        async with self.containers.held(cid) as c:
            if c is None:
                raise NotFound(f"container {cid!r} not found")
            if c.state != pb.CONTAINER_CREATED:
                state = pb.ContainerState.Name(c.state)
                raise FailedPrecondition(f"container {c.id} is {state}, not CREATED")
            await self.nri.start_container(c)
            # Set before the start, so an exit reported while it runs is never earlier.
            c.started_at = time.time_ns()
            self._starting.add(c.id)
            try:
                if c.restore_images:
                    await self._restore(c)
                else:
                    await self.launcher.start(c.id, c.handler)
            except PycriError as e:
                # Reported EXITED, so nothing may run: a start cut off by its deadline
                # may have started the process all the same.
                with contextlib.suppress(PycriError):
                    await self.launcher.kill(c.id, c.handler, signal.SIGKILL)
                c.state, c.exit_code, c.started_at = pb.CONTAINER_EXITED, 128, 0
                c.reason, c.message = "StartError", str(e)
                c.finished_at = time.time_ns()
                self._save(c)
                raise
            finally:
                self._starting.discard(c.id)
            if c.state == pb.CONTAINER_CREATED:
                c.state = pb.CONTAINER_RUNNING
            self._save(c)
            self._publish(c, events.STARTED)
            await self.nri.post_start_container(c)
            if c.state == pb.CONTAINER_EXITED:  # it exited while being started
                self._publish(c, events.STOPPED)
                self._nri_stop(c)

    async def _restore(self, c: Container) -> None:
        """Start by restoring the checkpointed processes (the container was created from an
        archive): they run on from where they were, watched by conmon like any other."""
        images = Path(c.restore_images)
        created = await self.launcher.restore(
            c.id, c.handler, self._monitor_log(c), images, self.cfg.checkpoint.criu,
            tty=c.config.tty, stdin=c.config.stdin, stdin_once=c.config.stdin_once)
        c.pid, c.conmon_pid, c.pid_start = created.pid, created.conmon_pid, created.start_time
        c.restore_images = ""
        await asyncio.to_thread(self._unstage, c)
        await asyncio.to_thread(shutil.rmtree, images, True)

    async def stop(self, cid: str, timeout: int) -> None:
        """Stop signal, then SIGKILL after `timeout` seconds; gone or exited is success."""
        async with self.containers.held(cid) as c:
            if c is not None:
                await self._stop_locked(c, timeout)

    async def _stop_locked(self, c: Container, timeout: int) -> None:
        if c.state in RUNNING_STATES and c.restore_images:
            self._stop_unrestored(c)
        elif c.state in RUNNING_STATES:
            await self._kill(c, timeout)
        await self._nri_stopped(c)

    def _stop_unrestored(self, c: Container) -> None:
        """A container made from a checkpoint and not restored yet has no process (only
        its bundle): there is no exit to wait for. It exits as a created container
        killed before its start does, with 137."""
        c.state, c.exit_code, c.reason = pb.CONTAINER_EXITED, 128 + signal.SIGKILL, "Error"
        c.message = "stopped before its restore"
        c.finished_at = time.time_ns()
        self._save(c)
        self._publish(c, events.STOPPED)
        self._nri_stop(c)

    async def _kill(self, c: Container, timeout: int) -> None:
        if timeout > 0 and c.state == pb.CONTAINER_RUNNING:
            await self.launcher.kill(c.id, c.handler, parse_signal(c.stop_signal))
            if await self.launcher.wait_exit(c.id, timeout):
                return
        await self.launcher.kill(c.id, c.handler, signal.SIGKILL)
        if not await self.launcher.wait_exit(c.id, KILL_WAIT):
            raise PycriError(f"container {c.id} did not exit after SIGKILL")

    async def remove(self, cid: str) -> None:
        async with self.containers.held(cid) as c:
            if c is None:
                return
            await self._remove_locked(c)
        self.containers.unlock(c.id)

    async def _remove_locked(self, c: Container) -> None:
        if (reaping := self._reaping.get(c.id)) is not None:
            await asyncio.shield(reaping)
        # Decide on the runtime, not the record: after a failed start the record says
        # EXITED while `runc init` may still be there; kill it and record its exit first.
        if self.launcher.exit_code(c.id) is None and (
            await self.launcher.state(c.id, c.handler) is not None
        ):
            await self.launcher.kill(c.id, c.handler, signal.SIGKILL)
            await self.launcher.wait_exit(c.id, KILL_WAIT)
        await self._nri_stopped(c)
        await self.launcher.delete(c.id, c.handler)
        await asyncio.to_thread(mounts.unstage_all, mounts.rootfs_staging(self.cfg.state, c.id))
        await self.images.remove_rootfs(c.id)
        await self._remove_image_volumes(c)
        self._unstage(c)  # left only by a crash during create
        if not c.log_path:
            (self.log_root / f"{c.id}.log").unlink(missing_ok=True)
        await self.nri.remove_container(c)
        self._forget(c)
        self._publish(c, events.DELETED)
        sb = self.sandboxes.sandboxes.get(c.sandbox_id)
        if sb is not None:
            self.containers.release(c.name_key(sb.config), c.id)
        log.info("container %s removed", c.id)

    async def stop_all(self, sandbox_id: str) -> None:
        await asyncio.gather(*(self.stop(c.id, 0) for c in self.of_sandbox(sandbox_id)))

    async def remove_all(self, sandbox_id: str) -> None:
        await asyncio.gather(*(self.remove(c.id) for c in self.of_sandbox(sandbox_id)))

    # -- exits ---------------------------------------------------------------------

    def on_exit(self, oid: str, code: int, finished_at: int) -> None:
        c = self.containers.get(oid)
        if c is None or c.state == pb.CONTAINER_EXITED:
            return
        # Exit files carry a coarse-clock mtime; never report an exit before the start.
        finished_at = max(finished_at, c.started_at)
        c.state, c.exit_code, c.finished_at = pb.CONTAINER_EXITED, code, finished_at
        if self.launcher.oom_killed(oid):
            c.reason = "OOMKilled"
        elif lost := self.launcher.monitor_lost(oid):
            c.reason, c.message = "MonitorDied", lost
        else:
            c.reason = "Completed" if code == 0 else "Error"
        self._save(c)
        self._kill_leftovers(c)
        if oid not in self._starting:  # start() reports it after STARTED
            self._publish(c, events.STOPPED)
            self._nri_stop(c)

    def _nri_stop(self, c: Container) -> None:
        """NRI plugins hear of every exit, stopped or by itself. Stop and remove wait
        for it, so StopContainer reaches them before whatever the caller does next."""
        if self.nri.wants(nri_api.STOP_CONTAINER):
            self._nri_stops[c.id] = asyncio.ensure_future(self.nri.stop_container(c))

    async def _nri_stopped(self, c: Container) -> None:
        task = self._nri_stops.pop(c.id, None)
        if task is not None:
            try:
                await asyncio.shield(task)
            except Exception as e:  # already logged by the adaptation where it matters
                log.warning("NRI StopContainer of %s: %s", c.id, e)

    def _kill_leftovers(self, c: Container) -> None:
        """The container is EXITED: nothing may run on in its cgroup (what it left in a
        shared PID namespace, execs). A thread, as cgroupfs is blocking file I/O."""
        if not c.cgroups_path or c.id in self._reaping:
            return
        task = asyncio.ensure_future(asyncio.to_thread(kill_leftovers, c.cgroups_path, c.id))
        self._reaping[c.id] = task
        task.add_done_callback(functools.partial(self._reaped, c.id))

    def _reaped(self, cid: str, task: asyncio.Task[int]) -> None:
        self._reaping.pop(cid, None)
        if not task.cancelled() and (e := task.exception()) is not None:
            log.warning("killing what container %s left running: %s", cid, e)

    # -- status / list / update / exec -------------------------------------------------

    def list(
        self, flt: pb.ContainerFilter | pb.ContainerStatsFilter | None
    ) -> builtins.list[Container]:
        """Created containers matching a ListContainers or ListContainerStats filter."""
        out = [c for c in self.containers.values() if c.state != pb.CONTAINER_UNKNOWN]
        if flt is None:
            return out
        if flt.id:
            out = [c for c in out if c.id.startswith(flt.id)]
        if flt.pod_sandbox_id:
            out = [c for c in out if c.sandbox_id.startswith(flt.pod_sandbox_id)]
        if isinstance(flt, pb.ContainerFilter) and flt.HasField("state"):
            out = [c for c in out if c.state == flt.state.state]
        if flt.label_selector:
            sel = dict(flt.label_selector)
            out = [c for c in out if matches_labels(dict(c.config.labels), sel)]
        return out

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
                resources = adjust.to_cri_resources(resources, own)
            await self.launcher.runtime(c.handler).update(c.id, spec.resources_to_oci(resources))
            c.resources = json.loads(_to_json(resources))
            self._save(c)
            await self.nri.post_update_container(c)

    async def reopen_log(self, cid: str) -> None:
        c = self.get(cid)
        if c.state != pb.CONTAINER_RUNNING:
            raise FailedPrecondition(f"container {c.id} is not running")
        if not c.log_path:
            return
        await self.launcher.reopen_log(c.id, Path(c.log_path))

    async def exec_sync(self, cid: str, argv: builtins.list[str], timeout: int) -> ExecResult:
        c = self.get(cid)
        if c.state != pb.CONTAINER_RUNNING:
            raise FailedPrecondition(f"container {c.id} is not running")
        return await exec_sync(
            c.id, argv, runtime=self.launcher.runtime(c.handler), timeout=float(timeout),
            work_root=self.exec_root,
        )

    @property
    def exec_root(self) -> Path:
        """ExecSync work dirs: root-only, and swept at start (a crash leaves them)."""
        return Path(self.cfg.state) / "exec"

    # -- recovery --------------------------------------------------------------------

    async def recover(self) -> set[str]:
        """Reload the records, before the socket serves: no process and no runtime call,
        so it costs little however many there are. `recheck` then confirms them.
        Returns the IDs of those the records say run."""
        await asyncio.to_thread(self._sweep_staging)
        if n := await asyncio.to_thread(sweep_orphans, self.exec_root):
            log.info("cleared %d exec session(s) a crash left behind", n)
        for c in self.store.load(KIND, self._load):
            self.containers.put(c)
        self.unchecked = {c.id for c in self.containers.values()
                          if c.state != pb.CONTAINER_UNKNOWN}
        return {c.id for c in self.containers.values() if c.state in RUNNING_STATES}

    def _load(self, cid: str, rec: dict[str, Any]) -> Container:
        c = Container.from_record(cid, rec)
        sb = self.sandboxes.sandboxes.get(c.sandbox_id)
        if sb is not None:
            self.containers.reserve(c.name_key(sb.config), cid)
        return c

    async def recheck(self, runtime_calls: asyncio.Semaphore) -> None:
        """Learn each container's state from the facts on disk (see pycri/recovery.py):
        exits missed while down come from the exit files, containers whose state is gone
        (reboot) come back EXITED; the runtime is asked, `runtime_calls` at a time, only
        about CREATED containers (a start cut short may have gone through) and records
        of older pycris (no start time)."""
        found = [c for c in self.containers.values() if c.id in self.unchecked]
        revisions = {c.id: c.revision for c in found}
        asks: builtins.list[asyncio.Task[None]] = []
        async for c, probe in probed(found, lambda c: self.launcher.probe(c.id, c.init)):
            try:
                if isinstance(probe, Exception):
                    raise probe
                if probe.left_frozen:
                    asks.append(asyncio.create_task(self._thaw(c.id, runtime_calls)))
                if self._apply_probe(c, revisions[c.id], probe):
                    asks.append(asyncio.create_task(
                        self._ask_runtime(c, revisions[c.id], probe, runtime_calls)))
                    continue
            except Exception as e:  # one bad object never stops the others' recheck
                log.error("container %s: state not rechecked at start: %s", c.id, e)
            self.unchecked.discard(c.id)
        await self._remove_half_created()
        await asyncio.gather(*asks)

    def _apply_probe(self, c: Container, revision: int, probe: Probe) -> bool:
        """Act on what the disk says; True when only the runtime can tell."""
        if probe.fact is Fact.EXITED:
            self.on_exit(c.id, probe.exit_code, probe.finished_at)
            return False
        if probe.fact is Fact.LOST:
            if c.state in RUNNING_STATES and self.containers.get(c.id) is c and (
                    c.revision == revision):
                self._mark_lost(c)
            return False
        if c.restore_images and not probe.conmon_pid:
            return False  # created from a checkpoint, not restored yet: nothing runs
        if probe.conmon_pid:
            self.launcher.watch_monitor(c.id, probe.conmon_pid, probe.conmon_alive, c.init)
        if c.state not in RUNNING_STATES or probe.fact is Fact.GONE:
            # GONE: conmon writes the exit file (inotify brings it), or the monitor watch
            # records its loss. Never asks the runtime about a pid that is not ours.
            return False
        return not (probe.fact is Fact.RUNS and c.state == pb.CONTAINER_RUNNING)

    async def _ask_runtime(self, c: Container, revision: int, probe: Probe,
                           runtime_calls: asyncio.Semaphore) -> None:
        try:
            async with runtime_calls:
                state = await self.launcher.state(c.id, c.handler)
        except PycriError as e:
            log.error("container %s: state not rechecked at start: %s", c.id, e)
            return
        finally:
            self.unchecked.discard(c.id)
        async with self.containers.held(c.id) as cur:
            if cur is None or cur.revision != revision:
                return  # an RPC or an exit changed it meanwhile: that is newer knowledge
            if state is None:
                if not probe.conmon_alive:
                    self._mark_lost(cur)
                return
            status, changed = state.get("status"), False
            if (not cur.pid_start and status in ("created", "running")
                    and state.get("pid") == cur.pid and (init := identity_of(cur.pid))):
                cur.pid_start, changed = init.start, True  # an older pycri's record
            if cur.state == pb.CONTAINER_CREATED and status == "running":
                # A crash after the runtime started it but before the record said so: it
                # runs, so it must not stay CREATED (a second StartContainer would fail
                # and call it exited). The start time is when this was found.
                cur.state, cur.started_at, changed = pb.CONTAINER_RUNNING, time.time_ns(), True
            if changed:
                self._save(cur)

    async def _thaw(self, cid: str, runtime_calls: asyncio.Semaphore) -> None:
        """Thaw a container a checkpoint froze when pycri was killed during it."""
        try:
            async with runtime_calls, self.containers.held(cid) as c:
                if c is not None:
                    await self.launcher.thaw(cid, c.handler)
                    log.info("container %s: thawed, left frozen by a checkpoint a crash "
                             "cut short", cid)
        except PycriError as e:
            log.error("container %s: left frozen by a checkpoint, not thawed: %s", cid, e)

    def _mark_lost(self, c: Container) -> None:
        c.state, c.exit_code, c.reason = pb.CONTAINER_EXITED, 255, "Unknown"
        c.message = "container state was lost (host reboot?)"
        c.finished_at = time.time_ns()
        self._save(c)

    async def _remove_half_created(self) -> None:
        """A CreateContainer cut short by a crash: its ID never reached a client, and
        nobody else would ever remove it (or free its name)."""
        for c in [c for c in self.containers.values() if c.state == pb.CONTAINER_UNKNOWN]:
            log.info("removing container %s left half-created by a crash", c.id)
            try:
                async with self.containers.held(c.id) as cur:
                    if cur is not None:
                        await self._remove_locked(cur)
            except Exception as e:  # e.g. its runtime handler left the config
                log.error("container %s left half-created could not be removed: %s", c.id, e)


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


def _to_json(msg: Any) -> str:
    return json_format.MessageToJson(msg, preserving_proto_field_name=True)
