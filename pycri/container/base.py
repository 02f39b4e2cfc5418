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

from pycri.api import api_pb2 as pb
from pycri.cdi import registry as cdi
from pycri.config import Config
from pycri.criu.support import CheckpointSupport
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

    def _monitor_log(self, c: Container) -> Path:
        """Where conmon writes the container's output (made if need be)."""
        log_path = Path(c.log_path) if c.log_path else self.log_root / f"{c.id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        return log_path

    @property
    def exec_root(self) -> Path:
        """ExecSync work dirs: root-only, and swept at start (a crash leaves them)."""
        return Path(self.cfg.state) / "exec"


def _to_json(msg: Any) -> str:
    return json_format.MessageToJson(msg, preserving_proto_field_name=True)
