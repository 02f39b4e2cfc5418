"""The container manager's shared state: the record index, the store, the parts it
drives, and where a container's files are. The other modules of the package are
mixins over ContainerBase, one story each (see manager.py).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from pycri import beneath
from pycri.api import api_pb2 as pb
from pycri.cdi import registry as cdi
from pycri.config import Config
from pycri.criu.support import CheckpointSupport
from pycri.errors import InvalidArgument
from pycri.events import Event, EventBus
from pycri.image.manager import ImageManager
from pycri.launcher import Launcher
from pycri.nri.adaptation import Adaptation
from pycri.oci import mounts
from pycri.sandbox.manager import SandboxManager
from pycri.store import Store
from pycri.store.container import KIND, Container
from pycri.store.records import Records

RUNNING_STATES = (pb.CONTAINER_CREATED, pb.CONTAINER_RUNNING)
LOG_MODE = 0o640  # the kubelet (root) reads it; no one else writes it


class ContainerBase:
    """The attributes every mixin of ContainerManager shares, declared once so mypy
    checks each mixin against them."""

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
        self.launcher = launcher
        self.sandboxes = sandboxes
        self.images = images
        self.nri: Adaptation = sandboxes.nri
        self.containers: Records[Container] = Records(
            "container", store, KIND, lambda c: c.sandbox_id)
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

    def _publish(self, c: Container, kind: int) -> None:
        self.events.publish(Event(c.id, c.sandbox_id, kind, time.time_ns()))

    def of_sandbox(self, sandbox_id: str) -> list[Container]:
        return self.containers.of_pod(sandbox_id)

    def known_of_sandbox(self, sandbox_id: str) -> list[Container]:
        """The pod's containers whose state is known: what its status, events and stats
        report (an UNKNOWN one is left out until its recheck)."""
        return [c for c in self.of_sandbox(sandbox_id) if c.state != pb.CONTAINER_UNKNOWN]

    # -- where a container's files are ------------------------------------------

    def rro_dir(self, cid: str) -> Path:
        return self.rro_root / cid

    def _unstage(self, c: Container) -> None:
        mounts.unstage_all(self.rro_dir(c.id))

    def _monitor_log(self, c: Container) -> tuple[Path, bool]:
        """Where conmon writes the container's output, and whether it was made here. In
        the pod's log directory (the kubelet's) it is made here first, beneath that
        directory with no link followed, with its final mode: a link planted there is
        refused before conmon, which opens the path as it is, writes anything (issue
        41). Blocking: call in a thread."""
        if not c.log_path:
            log_path = self.log_root / f"{c.id}.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            return log_path, False
        base, rel = _log_parts(c)
        try:
            base.mkdir(parents=True, exist_ok=True)  # the kubelet's path: it named it
            made = beneath.ensure_file(base, rel, LOG_MODE, make_dirs=0o755)
        except OSError as e:
            raise _refused(c, rel, e, "nothing was written") from None
        return Path(c.log_path), made

    def _remove_log(self, c: Container) -> None:
        """Undo `_monitor_log`'s file, reached the same way."""
        beneath.remove(*_log_parts(c))

    def _check_log_for_reopen(self, c: Container) -> None:
        """Before conmon reopens the log: no link on the way to it, and none at the
        temporary name conmon writes first and renames over it (it follows both)."""
        base, rel = _log_parts(c)
        try:
            beneath.refuse_link(base, rel + ".tmp")
        except OSError as e:
            raise _refused(c, rel, e, "not reopened") from None

    @property
    def exec_root(self) -> Path:
        """ExecSync work dirs: root-only, and swept at start (a crash leaves them)."""
        return Path(self.cfg.state) / "exec"


def _log_parts(c: Container) -> tuple[Path, str]:
    """(the pod's log directory, the container's log_path within it): the gate keeps
    log_path relative and normalised, so the directory is what precedes it."""
    rel = Path(c.config.log_path)
    return Path(c.log_path).parents[len(rel.parts) - 1], str(rel)


def _refused(c: Container, rel: str, e: OSError, outcome: str) -> InvalidArgument:
    """A log file beneath.py would not make or reach: the component and why."""
    return InvalidArgument(f"log file {c.log_path}: {e.filename or rel} {e.strerror or e}; "
                           f"{outcome}")


def _to_json(msg: Any) -> str:
    return json_format.MessageToJson(msg, preserving_proto_field_name=True)
