"""One stats sample of a cgroup: what ContainerStats and PodSandboxStats are made of,
taken from the cgroup reader's facts (pycri/cgroups.py knows the files)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pycri.cgroups import CGROUP_ROOT, Cgroup, Pressure


@dataclass(frozen=True)
class Usage:
    """One sample of a cgroup. The counters are 0 for a cgroup that is gone; the optional
    fields are None (or empty) when the host does not account them, never 0."""

    cpu_ns: int = 0  # cumulative CPU time
    memory_bytes: int = 0  # usage including page cache
    working_set_bytes: int = 0  # usage minus inactive file pages (what eviction watches)
    rss_bytes: int = 0
    page_faults: int = 0
    major_page_faults: int = 0
    processes: int = 0
    memory_limit: int | None = None  # None: no limit
    swap_bytes: int | None = None  # None: no swap accounting
    swap_limit: int | None = None  # swap alone (v1: memsw minus memory); None: no limit
    pressure: Pressure = field(default_factory=dict)

    @property
    def available_bytes(self) -> int | None:
        """The CRI's memory limit minus working set; None without a limit."""
        if self.memory_limit is None:
            return None
        return max(0, self.memory_limit - self.working_set_bytes)

    @property
    def swap_available_bytes(self) -> int | None:
        """The CRI's swap limit minus swap usage; None without a limit or accounting."""
        if self.swap_limit is None or self.swap_bytes is None:
            return None
        return max(0, self.swap_limit - self.swap_bytes)


_COUNTERS = ("cpu_ns", "memory_bytes", "working_set_bytes", "rss_bytes", "page_faults",
             "major_page_faults", "processes")


def read_usage(cgroups_path: str, root: Path = CGROUP_ROOT) -> Usage:
    """Current usage; zeros (and nothing optional) for a cgroup that is gone."""
    cg = Cgroup.of(cgroups_path, root)
    return Usage(
        cpu_ns=cg.cpu_ns,
        memory_bytes=cg.memory_usage,
        working_set_bytes=cg.working_set,
        rss_bytes=cg.rss,
        page_faults=cg.faults[("pgfault", "hierarchy")],
        major_page_faults=cg.faults[("pgmajfault", "hierarchy")],
        processes=cg.processes,
        memory_limit=cg.memory_limit,
        swap_bytes=cg.swap,
        swap_limit=cg.swap_limit,
        pressure=cg.pressure,
    )


def read_pod(rel: str, root: Path = CGROUP_ROOT) -> tuple[int | None, Pressure]:
    """(memory limit, pressure) of a pod's own cgroup directory `rel`."""
    cg = Cgroup(rel, root)
    return cg.memory_limit, cg.pressure


def add(a: Usage, b: Usage) -> Usage:
    """The counters summed: a pod's usage is its containers' together. Limits and
    pressure belong to one cgroup and cannot be summed; the caller reads the pod's."""
    return Usage(**{f: getattr(a, f) + getattr(b, f) for f in _COUNTERS})
