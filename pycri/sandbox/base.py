"""The sandbox manager's shared state: its parts, the record index, where a pod's
files live, and how a record is saved, announced and forgotten. Each story of the
lifecycle (run.py, teardown.py, resize.py, queries.py, recovery.py) is a mixin over
this base, so mypy checks each against the attributes declared here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from pycri.api import api_pb2 as pb
from pycri.config import Config
from pycri.events import Event, EventBus
from pycri.image.manager import ImageManager
from pycri.image.snapshots import Idmap
from pycri.launcher import Launcher
from pycri.network import CNIManager
from pycri.nri.adaptation import Adaptation
from pycri.oci import selinux, spec, userns
from pycri.sandbox.host import own_capabilities, own_oom_score_adj
from pycri.store import Store
from pycri.store.records import Records
from pycri.store.sandbox import KIND, Sandbox


class PodContainers(Protocol):
    """What the sandbox lifecycle needs from the container lifecycle."""

    async def stop_all(self, sandbox_id: str) -> None: ...

    async def remove_all(self, sandbox_id: str) -> None: ...


class SandboxBase:
    """The state every story of the lifecycle shares."""

    def __init__(
        self,
        cfg: Config,
        store: Store,
        launcher: Launcher,
        cni: CNIManager,
        images: ImageManager,
        events: EventBus,
        nri: Adaptation,
    ) -> None:
        self.cfg = cfg
        self.events = events
        self.launcher = launcher
        self.cni = cni
        self.images = images
        self.nri = nri
        self.containers: PodContainers | None = None
        self.sandboxes: Records[Sandbox] = Records("pod sandbox", store, KIND)
        # RunPodSandbox in flight: not listed until READY (nor while NRI plugins see it).
        self._running: set[str] = set()
        self.pod_root = Path(cfg.root) / "sandboxes"
        self.state_root = Path(cfg.state) / "sandboxes"
        self.min_oom_score_adj = own_oom_score_adj() if cfg.restrict_oom_score_adj else -1000
        self.capabilities = own_capabilities()
        self.selinux = selinux.enabled()
        # What this host can do for pods with their own user namespace (probed at start).
        self.userns_support: userns.Support | None = None
        self.unchecked: set[str] = set()  # loaded at start, state not rechecked yet

    # -- lookup ------------------------------------------------------------------

    def get(self, sid: str) -> Sandbox:
        """By full ID or unique prefix; NotFound otherwise."""
        return self.sandboxes.lookup(sid)

    def find(self, sid: str) -> Sandbox | None:
        return self.sandboxes.find(sid)

    def pod_dir(self, sid: str) -> Path:
        return self.pod_root / sid

    def state_dir(self, sid: str) -> Path:
        return self.state_root / sid

    def shm_path(self, sb: Sandbox) -> Path | None:
        """The pod's own /dev/shm mount; None when the pod shares the host's IPC."""
        ipc = sb.config.linux.security_context.namespace_options.ipc
        return None if ipc == pb.NODE else self.state_dir(sb.id) / "shm"

    def shm_source(self, sb: Sandbox) -> str:
        """What containers bind at /dev/shm."""
        shm = self.shm_path(sb)
        return str(shm) if shm else "/dev/shm"

    def userns(self, sb: Sandbox) -> spec.UserNamespace | None:
        """The pod's own user namespace (pinned in its state dir), if it has one."""
        maps = spec.pod_id_maps(sb.config)
        if maps is None:
            return None
        return spec.UserNamespace(str(self.state_dir(sb.id) / "userns"), *maps)

    def idmap(self, sb: Sandbox) -> Idmap | None:
        """How the pod's layers and volumes are shown to its user namespace, if it has one."""
        ns = self.userns(sb)
        if ns is None:
            return None
        return Idmap(Path(ns.path), ns.uids[0].host_id, ns.gids[0].host_id)

    def _publish(self, sb: Sandbox, kind: int) -> None:
        """Sandboxes report their own lifecycle as container events, as the kubelet expects."""
        self.events.publish(Event(sb.id, sb.id, kind, time.time_ns()))

