"""The pod cgroup pycri makes itself, for a pod that names no cgroup_parent.

The kubelet owns the pod cgroup it names in `cgroup_parent` and writes its limits
itself, so pycri never writes there. A pod without one (`crictl runp`) would have no
pod-level bound at all; when it asks for pod-level limits (`resources`, plus the
handler's `overhead`), pycri creates `/pycri/pod-<id>` with them, and the infra and
every container of the pod go below it. cgroupfs driver only: under systemd a slice
is systemd's to create. Blocking cgroupfs I/O: call these from a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pycri.cgroups import CGROUP_ROOT, Cgroup, is_v2

log = logging.getLogger(__name__)

PARENT = "/pycri"  # where pycri's own cgroups go (spec.cgroups_path's default)


def path_for(sandbox_id: str) -> str:
    return f"{PARENT}/pod-{sandbox_id}"


def _shares_to_weight(shares: int) -> int:
    """cgroup v1 cpu.shares (2..262144) onto v2 cpu.weight (1..10000), as runc maps it."""
    return 1 + ((shares - 2) * 9999) // 262142


def create(path: str, limits: Mapping[str, Any], root: Path = CGROUP_ROOT) -> None:
    """Make the pod cgroup at `path` (from path_for) and write `limits`
    (spec.pod_limits' cpu shares/quota/period and memory limit) into it."""
    rel = path.lstrip("/")
    if is_v2(root):
        _enable_controllers(root, rel)
    for f, value in _limit_files(root, rel, limits, reset=False):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(value)


def update(path: str, limits: Mapping[str, Any], root: Path = CGROUP_ROOT) -> None:
    """UpdatePodSandboxResources: write `limits` into the pod cgroup `create` made, a
    limit the pod no longer sets back to the kernel's default (unlimited). Only
    controllers whose directory exists are written: the pod cgroup's children, the
    containers, already live in it. Raises OSError at the first file the kernel
    refuses (a memory limit below what the pod uses that cannot be reclaimed, a quota
    below a child's): the caller writes the old limits back."""
    rel = path.lstrip("/")
    for f, value in _limit_files(root, rel, limits, reset=True):
        if f.parent.is_dir():
            try:
                f.write_text(value)
            except OSError as e:  # a write(2) failure names no file by itself
                raise OSError(e.errno, e.strerror, str(f)) from None


# What a limit no one sets any more goes back to (the kernel's defaults).
_UNSET_V2 = {"cpu.weight": "100", "cpu.max": "max", "memory.max": "max"}
_UNSET_V1 = {"cpu.shares": "1024", "cpu.cfs_quota_us": "-1", "memory.limit_in_bytes": "-1"}


def _limit_files(root: Path, rel: str, limits: Mapping[str, Any], reset: bool
                 ) -> list[tuple[Path, str]]:
    """(file, value) of `limits` in write order; with `reset`, also the default of each
    limit `limits` leaves unset."""
    cpu, memory = limits.get("cpu", {}), limits.get("memory", {})
    files: dict[Path, str] = {}
    cg = Cgroup(rel, root)
    if cg.v2:
        d = Path(cg.unified)
        if reset:
            files.update((d / name, value) for name, value in _UNSET_V2.items())
        if "shares" in cpu:
            files[d / "cpu.weight"] = str(_shares_to_weight(cpu["shares"]))
        if "quota" in cpu:
            files[d / "cpu.max"] = f"{cpu['quota']} {cpu['period']}"
        if "limit" in memory:
            files[d / "memory.max"] = str(memory["limit"])
        # Controller files the gate let through (memory.oom.group, ...); v1 has none.
        files.update((d / name, value) for name, value in limits.get("unified", {}).items())
        return list(files.items())
    c, m = Path(cg.dir("cpu")), Path(cg.dir("memory"))
    if reset:
        files.update((c / name, value) for name, value in _UNSET_V1.items() if "cpu" in name)
        files[m / "memory.limit_in_bytes"] = _UNSET_V1["memory.limit_in_bytes"]
    if "shares" in cpu:
        files[c / "cpu.shares"] = str(cpu["shares"])
    if "quota" in cpu:  # the period first: a quota is checked against it
        files.pop(c / "cpu.cfs_quota_us", None)
        files[c / "cpu.cfs_period_us"] = str(cpu["period"])
        files[c / "cpu.cfs_quota_us"] = str(cpu["quota"])
    if "limit" in memory:
        files[m / "memory.limit_in_bytes"] = str(memory["limit"])
    return list(files.items())


def _enable_controllers(root: Path, rel: str) -> None:
    """v2: cpu and memory files exist in a cgroup only once its parent delegates them."""
    d = root
    for part in Path(rel).parts:
        (d / "cgroup.subtree_control").write_text("+cpu +memory")
        d = d / part
        d.mkdir(exist_ok=True)


def remove(path: str, sandbox_id: str, root: Path = CGROUP_ROOT) -> None:
    """rmdir the pod cgroup in every hierarchy (the runtime made it in those pycri did
    not); its containers' and infra's cgroups are gone by now. Only a path that is this
    pod's own is touched, so a bad record can never remove a parent."""
    if path != path_for(sandbox_id):
        log.warning("not removing cgroup %r: it is not pod %s's own", path, sandbox_id)
        return
    for d in Cgroup(path.lstrip("/"), root).dirs():
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("pod cgroup %s not removed: %s", d, e)
