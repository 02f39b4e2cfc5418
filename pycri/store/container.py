"""The container record: what pycri remembers about a container, in memory and in the store."""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, field
from typing import Any

from google.protobuf import json_format

from pycri.api import api_pb2 as pb
from pycri.store import typed
from pycri.store.identity import Identity

KIND = "container"


@dataclass
class Container:
    id: str
    sandbox_id: str
    config: pb.ContainerConfig
    image_id: str
    image_ref: str  # the repo digest the image was pulled by, else its ID
    handler: str
    created_at: int
    log_path: str
    state: int = pb.CONTAINER_UNKNOWN  # UNKNOWN until CreateContainer completes
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    pid: int = 0
    conmon_pid: int = 0
    # The init's start time (/proc/<pid>/stat field 22): with `pid` it names the process
    # after a restart. 0 in records of older pycris and while not known.
    pid_start: int = 0
    stop_signal: str = ""
    uid: int = 0
    gid: int = 0
    groups: list[int] = field(default_factory=list)
    resources: dict[str, Any] = field(default_factory=dict)  # CRI LinuxContainerResources
    cgroups_path: str = ""  # the OCI linux.cgroupsPath the runtime was given
    # CRIU's images a StartContainer restores the process from (a container created from
    # a checkpoint archive); "" for a container started afresh, and once restored.
    restore_images: str = ""
    # Per CRI mount: the image ID of an image volume, "" for a host path mount.
    mount_image_ids: list[str] = field(default_factory=list)
    # Bumped on every save, so readers can cache what they derive from a record.
    revision: int = field(default=0, compare=False)

    def name_key(self, sandbox_config: pb.PodSandboxConfig) -> str:
        """One live container per (name, attempt) in a pod."""
        md, pmd = self.config.metadata, sandbox_config.metadata
        return f"{md.name}_{pmd.name}_{pmd.namespace}_{pmd.uid}_{md.attempt}"

    def image_volumes(self) -> list[tuple[int, str]]:
        """(mount index, view key) of each image volume; the key is derived, never stored,
        so RemoveContainer finds the views after a restart."""
        return [(i, f"{self.id}-vol{i}") for i, m in enumerate(self.config.mounts)
                if m.image.image]

    @property
    def init(self) -> Identity | None:
        """The container's init process, if its identity is known."""
        return Identity(self.pid, self.pid_start) if self.pid and self.pid_start else None

    def to_record(self) -> dict[str, Any]:
        rec = asdict(self)
        del rec["id"], rec["revision"]
        rec["config"] = base64.b64encode(self.config.SerializeToString()).decode()
        return rec

    @classmethod
    def from_record(cls, cid: str, rec: dict[str, Any]) -> Container:
        """The record as stored: every field of its type (typed.check), the config a
        ContainerConfig, the resources a LinuxContainerResources; TypeError or
        ValueError otherwise, and Store.load sets the row aside."""
        data = dict(rec)
        config = pb.ContainerConfig()
        config.ParseFromString(base64.b64decode(data.pop("config"), validate=True))
        typed.check(cls, data, f"container {cid}")
        json_format.ParseDict(data.get("resources", {}), pb.LinuxContainerResources())
        return cls(id=cid, config=config, **data)
