"""Start, stop and remove, and exits: exits arrive from conmon's exit files through
the launcher and are recorded before anyone asks; NRI plugins hear of each, and
whatever a container left in its cgroup is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
import signal
import time
from pathlib import Path

from pycri import events
from pycri.api import api_pb2 as pb
from pycri.container.base import RUNNING_STATES, ContainerBase
from pycri.container.signals import parse_signal
from pycri.errors import FailedPrecondition, NotFound, PycriError
from pycri.monitor.cgroupkill import kill_leftovers
from pycri.nri.api import api_pb2 as nri_api
from pycri.oci import mounts
from pycri.store.container import Container

log = logging.getLogger(__name__)


KILL_WAIT = 30.0


class ContainerLifecycle(ContainerBase):
    """Start, stop and remove under the container's lock; exits recorded as they come."""

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
                self.containers.save(c)
                raise
            finally:
                self._starting.discard(c.id)
            if c.state == pb.CONTAINER_CREATED:
                c.state = pb.CONTAINER_RUNNING
            self.containers.save(c)
            self._publish(c, events.STARTED)
            await self.nri.post_start_container(c)
            if c.state == pb.CONTAINER_EXITED:  # it exited while being started
                self._publish(c, events.STOPPED)
                self._nri_stop(c)

    async def _restore(self, c: Container) -> None:
        """Start by restoring the checkpointed processes (the container was created from an
        archive): they run on from where they were, watched by conmon like any other."""
        images = Path(c.restore_images)
        log_path, _ = await asyncio.to_thread(self._monitor_log, c)
        created = await self.launcher.restore(
            c.id, c.handler, log_path, images, self.cfg.checkpoint.criu,
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
        self.containers.save(c)
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
        self.containers.forget(c)
        self._publish(c, events.DELETED)
        sb = self.sandboxes.sandboxes.get(c.sandbox_id)
        if sb is not None:
            self.containers.release(c.name_key(sb.config), c.id)
        log.info("container %s removed", c.id)

    async def stop_all(self, sandbox_id: str) -> None:
        await asyncio.gather(*(self.stop(c.id, 0) for c in self.of_sandbox(sandbox_id)))

    async def remove_all(self, sandbox_id: str) -> None:
        await asyncio.gather(*(self.remove(c.id) for c in self.of_sandbox(sandbox_id)))

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
        self.containers.save(c)
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

    async def _remove_image_volumes(self, c: Container) -> None:
        for _, key in c.image_volumes():
            await self.images.remove_view(key)
