"""linux.resources and linux.cgroupsPath: the CRI container limits, the limits of a pod
cgroup pycri makes itself, and where the cgroups go."""

from __future__ import annotations

import posixpath
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument

CFS_PERIOD = 100_000  # µs, the kernel's default (and the kubelet's) CFS period
MAX_CPU_SHARES = 262_144
MAX_CPU_QUOTA = 2**44 - 1  # µs: the largest CFS quota the kernel takes (cgroup v1 and v2)
MAX_MEMORY = 2**63 - 1


def cgroups_path(parent: str, driver: str, object_id: str) -> str:
    """cgroupfs: `<parent>/<id>` (parent defaults to /pycri);
    systemd: `<slice>:pycri:<id>` (slice defaults to system.slice), which runc makes
    `pycri-<id>.scope`.

    The last component is the bare ID (or ends in `-<id>.scope`) because that is how
    a kubelet matches its cAdvisor's cgroups to CRI containers: it takes the base name
    of the cgroup, and under systemd what follows its last `-`, as the container ID.
    Named `pycri-<id>` under cgroupfs, no container had cAdvisor's memory fields in the
    Summary API."""
    if driver == "cgroupfs":
        parent = "/" + (parent or "/pycri").strip("/")
        if ".." in parent.split("/"):
            raise InvalidArgument(f"cgroup parent {parent!r} must not contain '..'")
        return posixpath.join(parent, object_id)
    if driver == "systemd":
        slice_ = parent or "system.slice"
        if "/" in slice_ or not slice_.endswith(".slice"):
            raise InvalidArgument(
                f"cgroup parent {parent!r} is not a systemd slice (name ending in .slice)"
            )
        return f"{slice_}:pycri:{object_id}"
    raise InvalidArgument(f"unknown cgroup driver {driver!r}")


def pod_limits(linux: pb.LinuxPodSandboxConfig) -> dict[str, Any]:
    """OCI-style cpu/memory limits of a pod cgroup pycri creates itself: the pod-level
    `resources` plus the handler's `overhead`, as the kubelet sizes the pod cgroups it
    owns, and the pod's cgroup v2 `unified` files. A limit the pod does not set stays
    unset: overhead alone bounds nothing.
    """
    res, ovh = linux.resources, linux.overhead
    cpu: dict[str, Any] = {}
    if res.cpu_shares > 0:
        cpu["shares"] = min(MAX_CPU_SHARES, res.cpu_shares + max(0, ovh.cpu_shares))
    if res.cpu_quota > 0:
        period = res.cpu_period or CFS_PERIOD
        extra = ovh.cpu_quota * period // (ovh.cpu_period or CFS_PERIOD) if ovh.cpu_quota > 0 else 0
        cpu["quota"], cpu["period"] = min(MAX_CPU_QUOTA, res.cpu_quota + extra), period
    out: dict[str, Any] = {"cpu": cpu} if cpu else {}
    if res.memory_limit_in_bytes > 0:
        limit = res.memory_limit_in_bytes + max(0, ovh.memory_limit_in_bytes)
        out["memory"] = {"limit": min(MAX_MEMORY, limit)}
    if res.unified:
        out["unified"] = dict(res.unified)
    return out


def resources_to_oci(res: pb.LinuxContainerResources) -> dict[str, Any]:
    """OCI linux.resources for CreateContainer and UpdateContainerResources; 0 = unset."""
    out: dict[str, Any] = {}
    cpu: dict[str, Any] = {}
    if res.cpu_shares:
        cpu["shares"] = res.cpu_shares
    if res.cpu_quota:
        cpu["quota"] = res.cpu_quota
    if res.cpu_period:
        cpu["period"] = res.cpu_period
    if res.cpuset_cpus:
        cpu["cpus"] = res.cpuset_cpus
    if res.cpuset_mems:
        cpu["mems"] = res.cpuset_mems
    if cpu:
        out["cpu"] = cpu
    memory: dict[str, Any] = {}
    if res.memory_limit_in_bytes:
        memory["limit"] = res.memory_limit_in_bytes
    if res.memory_swap_limit_in_bytes:
        memory["swap"] = res.memory_swap_limit_in_bytes
    if memory:
        out["memory"] = memory
    if res.hugepage_limits:
        out["hugepageLimits"] = [
            {"pageSize": h.page_size, "limit": h.limit} for h in res.hugepage_limits
        ]
    if res.unified:
        out["unified"] = dict(res.unified)
    return out
