"""After a restart: the records come back before the socket serves, then each
container's state is rechecked from the facts on disk (pycri/recovery.py).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import time
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.container.base import RUNNING_STATES
from pycri.container.lifecycle import ContainerLifecycle
from pycri.errors import PycriError
from pycri.monitor.execsync import sweep_orphans
from pycri.monitor.probe import Fact, Probe, identity_of, started_ns
from pycri.oci import mounts
from pycri.recovery import probed
from pycri.store.container import Container

log = logging.getLogger(__name__)


class ContainerRecovery(ContainerLifecycle):
    """Reload and recheck: exits found on disk go through on_exit, half-created
    containers through the removal path, as if seen live."""

    async def recover(self) -> set[str]:
        """Reload the records, before the socket serves: no process and no runtime call,
        so it costs little however many there are. `recheck` then confirms them.
        Returns the IDs of those the records say run."""
        await asyncio.to_thread(self._sweep_staging)
        if n := await asyncio.to_thread(sweep_orphans, self.exec_root):
            log.info("cleared %d exec session(s) a crash left behind", n)
        for c in self.containers.load(self._load):
            self.containers.put(c)
        self.unchecked = {c.id for c in self.containers.values()
                          if c.state != pb.CONTAINER_UNKNOWN}
        return {c.id for c in self.containers.values() if c.state in RUNNING_STATES}

    def _sweep_staging(self) -> None:
        """At start no create is in flight: every staged copy is a crash's leftover."""
        for staging in self.rro_root.iterdir() if self.rro_root.is_dir() else ():
            log.info("removing staged mounts left by a crash in %s", staging)
            mounts.unstage_all(staging)

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
                # A crash after the runtime started it but before the record said so (or
                # a record rebuilt from its bundle): it runs, so it must not stay CREATED
                # (a second StartContainer would fail and call it exited). Its start time
                # is its process's, else when this was found.
                started = started_ns(cur.pid_start) if cur.pid_start else 0
                cur.state, changed = pb.CONTAINER_RUNNING, True
                cur.started_at = started or time.time_ns()
            if changed:
                self.containers.save(cur)

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
        self.containers.save(c)

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
