"""The pod sandbox record: what pycri remembers about a pod, in memory and in the store."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.store import typed
from pycri.store.identity import Identity

KIND = "sandbox"


def name_key(md: pb.PodSandboxMetadata) -> str:
    """The reservation key: one live sandbox per (name, namespace, uid, attempt)."""
    return f"{md.name}_{md.namespace}_{md.uid}_{md.attempt}"


@dataclass
class Sandbox:
    id: str
    config: pb.PodSandboxConfig
    handler: str  # the configured handler actually used
    runtime_handler: str  # as requested (may be "")
    created_at: int  # ns since the epoch
    state: int = pb.SANDBOX_NOTREADY
    netns: str = ""  # pinned path; "" for host network
    ips: list[str] = field(default_factory=list)
    infra_pid: int = 0
    infra_start: int = 0  # its start time (see Container.pid_start); 0 if not known
    conmon_pid: int = 0
    cgroup_parent: str = ""
    own_cgroup: bool = False  # cgroup_parent is the pod cgroup pycri made (podcgroup.py)
    network_torn_down: bool = False
    # Bumped on every save, so readers can cache what they derive from a record.
    revision: int = field(default=0, compare=False)

    @property
    def host_network(self) -> bool:
        return self.config.linux.security_context.namespace_options.network == pb.NODE

    @property
    def name(self) -> str:
        return name_key(self.config.metadata)

    @property
    def infra(self) -> Identity | None:
        """The infra process, if its identity is known."""
        return Identity(self.infra_pid, self.infra_start) if (
            self.infra_pid and self.infra_start) else None

    def to_record(self) -> dict[str, Any]:
        return {
            "config": base64.b64encode(self.config.SerializeToString()).decode(),
            "handler": self.handler,
            "runtime_handler": self.runtime_handler,
            "created_at": self.created_at,
            "state": self.state,
            "netns": self.netns,
            "ips": self.ips,
            "infra_pid": self.infra_pid,
            "infra_start": self.infra_start,
            "conmon_pid": self.conmon_pid,
            "cgroup_parent": self.cgroup_parent,
            "own_cgroup": self.own_cgroup,
            "network_torn_down": self.network_torn_down,
        }

    @classmethod
    def from_record(cls, sid: str, rec: dict[str, Any]) -> Sandbox:
        """The record as stored, every field of its type (typed.check); TypeError,
        KeyError or ValueError otherwise, and Store.load sets the row aside."""
        config = pb.PodSandboxConfig()
        config.ParseFromString(base64.b64decode(rec["config"], validate=True))
        typed.check(cls, {k: v for k, v in rec.items() if k != "config"}, f"pod sandbox {sid}")
        return cls(
            id=sid,
            config=config,
            handler=rec["handler"],
            runtime_handler=rec["runtime_handler"],
            created_at=rec["created_at"],
            state=rec["state"],
            netns=rec["netns"],
            ips=list(rec["ips"]),
            infra_pid=rec["infra_pid"],
            infra_start=rec.get("infra_start", 0),  # absent in older pycris' records
            conmon_pid=rec["conmon_pid"],
            cgroup_parent=rec["cgroup_parent"],
            own_cgroup=rec.get("own_cgroup", False),
            network_torn_down=rec["network_torn_down"],
        )
