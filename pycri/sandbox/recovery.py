"""Exits and restarts: an infra that dies makes its pod NOTREADY, and at start the
records are reloaded, rechecked against the facts on disk, and CNI state no pod owns
is released."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
from pathlib import Path
from typing import Any

from pycri import events
from pycri.api import api_pb2 as pb
from pycri.errors import PycriError
from pycri.monitor.probe import Fact, Probe, identity_of
from pycri.network import PodNetwork
from pycri.network.cache import CorruptEntry
from pycri.recovery import probed
from pycri.sandbox.base import SandboxBase
from pycri.store.sandbox import Sandbox

log = logging.getLogger(__name__)


class Recovery(SandboxBase):
    def on_exit(self, oid: str, code: int, finished_at: int) -> None:
        """The infra process died: the pod is no longer ready."""
        sb = self.sandboxes.get(oid)
        if sb is not None and sb.state == pb.SANDBOX_READY:
            log.warning("infra of pod %s exited with %d; pod is NOTREADY", oid, code)
            sb.state = pb.SANDBOX_NOTREADY
            self.sandboxes.save(sb)
            self._publish(sb, events.STOPPED)

    async def recover(self) -> set[str]:
        """Reload the records, before the socket serves (no process, no runtime call);
        `recheck` then confirms that the READY ones still are. Returns their IDs."""
        for sb in self.sandboxes.load(self._load):
            self.sandboxes.put(sb)
        self.unchecked = set(self.sandboxes)
        return {sb.id for sb in self.sandboxes.values() if sb.state == pb.SANDBOX_READY}

    async def recheck(self, runtime_calls: asyncio.Semaphore) -> None:
        """A pod whose infra is gone (crash, reboot) comes back NOTREADY: decided from the
        facts on disk (see pycri/recovery.py); the runtime is asked, `runtime_calls` at a
        time, only about records of older pycris (no infra start time)."""
        found = [sb for sb in self.sandboxes.values() if sb.id in self.unchecked]
        revisions = {sb.id: sb.revision for sb in found}
        asks: builtins.list[asyncio.Task[None]] = []
        async for sb, facts in probed(found, self._probe):
            try:
                if isinstance(facts, Exception):
                    raise facts
                if self._apply_probe(sb, revisions[sb.id], *facts):
                    asks.append(asyncio.create_task(
                        self._ask_runtime(sb, revisions[sb.id], runtime_calls)))
                    continue
            except Exception as e:  # one bad object never stops the others' recheck
                log.error("pod %s: state not rechecked at start: %s", sb.id, e)
            self.unchecked.discard(sb.id)
        await asyncio.gather(*asks)
        await self._release_orphan_leases()

    def _apply_probe(self, sb: Sandbox, revision: int, probe: Probe, netns: bool) -> bool:
        """Act on what the disk says; True when only the runtime can tell."""
        if probe.conmon_pid and probe.fact not in (Fact.EXITED, Fact.LOST):
            self.launcher.watch_monitor(sb.id, probe.conmon_pid, probe.conmon_alive, sb.infra)
        if sb.state != pb.SANDBOX_READY or (probe.fact is Fact.RUNS and netns):
            return False
        if probe.fact is Fact.EXITED:
            if sb.revision == revision:
                self.on_exit(sb.id, probe.exit_code, probe.finished_at)
            return False
        if probe.fact is Fact.UNKNOWN and netns:
            return True
        self._not_survived(sb, revision)
        return False

    def _probe(self, sb: Sandbox) -> tuple[Probe, bool]:
        """The infra's facts, and whether the pod's network namespace is still there."""
        return self.launcher.probe(sb.id, sb.infra), not sb.netns or Path(sb.netns).exists()

    async def _ask_runtime(self, sb: Sandbox, revision: int,
                           runtime_calls: asyncio.Semaphore) -> None:
        state = None
        try:
            with contextlib.suppress(PycriError):
                async with runtime_calls:
                    state = await self.launcher.state(sb.id, sb.handler)
        finally:
            self.unchecked.discard(sb.id)
        running = state is not None and state.get("status") == "running"
        if running and state is not None and state.get("pid") == sb.infra_pid and (
                init := identity_of(sb.infra_pid)) and sb.revision == revision:
            sb.infra_start = init.start  # an older pycri's record: learn it now
            self.sandboxes.save(sb)
            revision = sb.revision
        if not running:
            self._not_survived(sb, revision)

    def _not_survived(self, sb: Sandbox, revision: int) -> None:
        """Mark a READY pod NOTREADY, unless an RPC changed (or removed) it meanwhile."""
        if (self.sandboxes.get(sb.id) is sb and sb.revision == revision
                and sb.state == pb.SANDBOX_READY):
            log.info("pod %s did not survive; marking NOTREADY", sb.id)
            sb.state = pb.SANDBOX_NOTREADY
            self.sandboxes.save(sb)

    def _load(self, sid: str, rec: dict[str, Any]) -> Sandbox:
        sb = Sandbox.from_record(sid, rec)
        self.sandboxes.reserve(sb.name, sid)
        return sb

    async def _release_orphan_leases(self) -> None:
        """CNI state with no sandbox behind it (a crash mid-run, a DEL that failed while
        the pod was being forgotten): tear it down once more, so no IP stays leased."""
        for sid in self.cni.cache.sandboxes():
            if sid in self.sandboxes:
                continue
            try:
                await self.cni.teardown(PodNetwork(sandbox_id=sid, netns="", name="",
                                                   namespace="", uid=""))
                log.info("released the CNI state of vanished pod %s", sid)
            except CorruptEntry as e:
                await self._set_cni_state_aside(sid, e)
            except PycriError as e:  # a plugin failed: kept for the next start
                log.warning("CNI state of vanished pod %s: %s", sid, e)
            except Exception as e:  # anything else a bad entry can cause
                await self._set_cni_state_aside(sid, e)

    async def _set_cni_state_aside(self, sid: str, error: Exception) -> None:
        try:
            where = await self.cni.cache.set_aside(sid)
        except OSError as e:
            log.error("CNI state of vanished pod %s is unusable (%s) and could not be set "
                      "aside: %s", sid, error, e)
            return
        log.error("CNI state of vanished pod %s is unusable (%s: %s); moved to %s",
                  sid, type(error).__name__, error, where)
