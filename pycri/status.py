"""The node-level answers of the runtime: version, readiness, runtime config.

Kept apart from the gRPC servicer so the rules (what makes the runtime or the
network "ready") live in plain Python and are tested without a server.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pycri import __version__
from pycri.config import Config
from pycri.oci.mounts import recursive_readonly_supported
from pycri.oci.userns import Support
from pycri.store import Store

RUNTIME_NAME = "pycri"
RUNTIME_API_VERSION = "v1"
# The version of the CRI client API this runtime implements; crictl prints it.
KUBE_API_VERSION = "0.1.0"


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str = ""
    message: str = ""


# A callable answering (ready, reason, message) for pod networking: CNIManager.status.
NetworkProbe = Callable[[], tuple[bool, str, str]]


class NodeStatus:
    """Answers Version, Status, RuntimeConfig and keeps UpdateRuntimeConfig's pod CIDR."""

    def __init__(
        self, cfg: Config, store: Store, network: NetworkProbe,
        userns: Support | None = None,
        recovery: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.network = network
        # How far the recheck after a restart got (pycri/recovery.py), for verbose Status.
        self.recovery = recovery
        # pycri stages recursively read-only mounts itself; it needs mount_setattr(2).
        self.recursive_read_only = recursive_readonly_supported()
        self.user_namespaces: dict[str, bool] = {}
        self.set_userns(userns)

    def set_userns(self, userns: Support | None) -> None:
        """By handler, can pods run in their own user namespace? Probed at start and
        again when a reload changes the handlers (pycri.oci.userns.probe)."""
        self.user_namespaces = {
            name: userns is not None and userns.problem(name) is None
            for name in self.handlers()
        }

    @property
    def pod_cidr(self) -> str:
        rec = self.store.get("runtime", "config")
        return str(rec.get("pod_cidr", "")) if rec else ""

    def update_pod_cidr(self, cidr: str) -> None:
        """Keep the kubelet's pod CIDR (written through, so it survives a restart)."""
        if cidr:
            self.store.put("runtime", "config", {"pod_cidr": cidr})

    def conditions(self) -> list[Condition]:
        handler = self.cfg.runtimes[self.cfg.default_runtime]
        if os.access(handler.path, os.X_OK):
            runtime = Condition("RuntimeReady", True)
        else:
            runtime = Condition(
                "RuntimeReady",
                False,
                "RuntimeBinaryMissing",
                f"default runtime {self.cfg.default_runtime!r}: {handler.path} is not executable",
            )
        ready, reason, message = self.network()
        return [runtime, Condition("NetworkReady", ready, reason, message)]

    def handlers(self) -> list[str]:
        """Runtime handler names; "" is the default handler, as the kubelet expects."""
        return ["", *sorted(self.cfg.runtimes)]

    def verbose_info(self) -> dict[str, str]:
        info = {
            "config": dataclasses.asdict(self.cfg),
            "podCIDR": self.pod_cidr,
            "version": __version__,
        }
        out = {"info": json.dumps(info, sort_keys=True)}
        if self.recovery is not None:
            out["recovery"] = json.dumps(self.recovery())
        return out
