"""Read a container's CPU and memory usage from its cgroup (v1, v2 or hybrid hosts).

The OCI `cgroupsPath` is turned into directories the same way the runtimes do:
cgroupfs paths are used as they are; systemd's `slice:prefix:name` becomes
`<slice hierarchy>/<prefix>-<name>.scope`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PSI_RESOURCES = ("cpu", "memory", "io")
# Limits above this are "no limit": the kernel's own maximum is LONG_MAX rounded down to
# a page, and v2 writes "max".
UNLIMITED = 1 << 62


@dataclass(frozen=True)
class PsiLine:
    """One line ("some" or "full") of a *.pressure file."""

    total_us: int  # cumulative stall time, in microseconds as the kernel counts it
    avg10: float
    avg60: float
    avg300: float


Pressure = Mapping[str, Mapping[str, PsiLine]]  # resource (cpu/memory/io) -> some/full -> line


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


def _systemd_dir(path: str) -> str:
    """`a-b.slice:pycri:ID` → `a.slice/a-b.slice/pycri-ID.scope` (systemd nesting)."""
    slice_name, prefix, name = path.split(":")
    parts: list[str] = []
    if slice_name != "-.slice":
        stem = slice_name.removesuffix(".slice").split("-")
        parts = ["-".join(stem[: i + 1]) + ".slice" for i in range(len(stem))]
    return "/".join([*parts, f"{prefix}-{name}.scope"])


def relative_dir(cgroups_path: str) -> str:
    """systemd's `slice:prefix:name`; anything else is a cgroupfs path, which is
    absolute and may itself hold ':' (a pod's cgroup_parent is the client's text)."""
    if not cgroups_path.startswith("/") and cgroups_path.count(":") == 2:
        return _systemd_dir(cgroups_path)
    return cgroups_path.lstrip("/")


def unified_dir(root: Path, rel: str) -> Path:
    """The cgroup's directory on the v2 hierarchy: the root itself on a pure v2 host, its
    `unified` mount on a hybrid one (where runc and crun put the same path). On a pure v1
    host it does not exist, and readers find nothing there."""
    if (root / "cgroup.controllers").exists():
        return root / rel
    return root / "unified" / rel


def parse_pressure(text: str) -> dict[str, PsiLine]:
    """A PSI file ("some avg10=0.12 avg60=.. avg300=.. total=USEC" / "full ..."), by kind;
    a line without a total is left out."""
    out: dict[str, PsiLine] = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        values = dict(pair.partition("=")[::2] for pair in pairs)
        try:
            out[kind] = PsiLine(int(values["total"]), float(values.get("avg10", 0)),
                                float(values.get("avg60", 0)), float(values.get("avg300", 0)))
        except (KeyError, ValueError):
            continue
    return out


def read_pressure(d: Path | str) -> dict[str, dict[str, PsiLine]]:
    """cpu/memory/io pressure of the v2 cgroup directory `d`; a missing file, no key."""
    out: dict[str, dict[str, PsiLine]] = {}
    for res in PSI_RESOURCES:
        psi = parse_pressure(read_text(f"{d}/{res}.pressure"))
        if psi:
            out[res] = psi
    return out


def read_text(path: Path | str) -> str:
    """A kernel file's text; "" when it cannot be read. os.read on a path string costs
    about a tenth of Path.read_text (no text wrapper, no encoding lookup), which counts
    at ten files per container per sample."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _read_optional(path: str) -> int | None:
    """The first number in a file; None for no such file (or not a number)."""
    try:
        return int(read_text(path).split()[0])
    except (ValueError, IndexError):
        return None


def _read_int(path: str) -> int:
    return _read_optional(path) or 0


def _read_limit(path: str) -> int | None:
    """A limit file; None for "max", no limit, or no such file."""
    value = _read_optional(path)
    return value if value is not None and 0 <= value <= UNLIMITED else None


def _read_kv(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in read_text(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def _pure_v2(root: Path) -> bool:
    return os.path.exists(f"{root}/cgroup.controllers")


def read_usage(cgroups_path: str, root: Path = CGROUP_ROOT) -> Usage:
    """Current usage; zeros (and nothing optional) for a cgroup that is gone."""
    rel = relative_dir(cgroups_path)
    if _pure_v2(root):
        return _v2(f"{root}/{rel}")
    return _v1(f"{root}", rel)


def read_pod(rel: str, root: Path = CGROUP_ROOT) -> tuple[int | None, Pressure]:
    """(memory limit, pressure) of a pod's own cgroup directory `rel`."""
    if _pure_v2(root):
        return _read_limit(f"{root}/{rel}/memory.max"), read_pressure(f"{root}/{rel}")
    return (_read_limit(f"{root}/memory/{rel}/memory.limit_in_bytes"),
            read_pressure(f"{root}/unified/{rel}"))


def _v2(d: str) -> Usage:
    cpu = _read_kv(f"{d}/cpu.stat")
    mem = _read_kv(f"{d}/memory.stat")
    current = _read_int(f"{d}/memory.current")
    return Usage(
        cpu_ns=cpu.get("usage_usec", 0) * 1000,
        memory_bytes=current,
        working_set_bytes=max(0, current - mem.get("inactive_file", 0)),
        rss_bytes=mem.get("anon", 0),
        page_faults=mem.get("pgfault", 0),
        major_page_faults=mem.get("pgmajfault", 0),
        processes=_read_int(f"{d}/pids.current"),
        memory_limit=_read_limit(f"{d}/memory.max"),
        swap_bytes=_read_optional(f"{d}/memory.swap.current"),
        swap_limit=_read_limit(f"{d}/memory.swap.max"),
        pressure=read_pressure(d),
    )


def _v1(root: str, rel: str) -> Usage:
    """A v1 or hybrid host; pressure only on the hybrid's v2 mount."""
    mem_dir = f"{root}/memory/{rel}"
    mem = _read_kv(f"{mem_dir}/memory.stat")
    usage = _read_int(f"{mem_dir}/memory.usage_in_bytes")
    limit = _read_limit(f"{mem_dir}/memory.limit_in_bytes")
    memsw = _read_limit(f"{mem_dir}/memory.memsw.limit_in_bytes")  # memory plus swap
    return Usage(
        cpu_ns=_read_int(f"{root}/cpuacct/{rel}/cpuacct.usage"),
        memory_bytes=usage,
        working_set_bytes=max(0, usage - mem.get("total_inactive_file", 0)),
        rss_bytes=mem.get("total_rss", 0),
        page_faults=mem.get("total_pgfault", 0),
        major_page_faults=mem.get("total_pgmajfault", 0),
        processes=_read_int(f"{root}/pids/{rel}/pids.current"),
        memory_limit=limit,
        swap_bytes=mem.get("total_swap"),  # only there with swap accounting
        swap_limit=None if limit is None or memsw is None else max(0, memsw - limit),
        pressure=read_pressure(f"{root}/unified/{rel}"),
    )


def add(a: Usage, b: Usage) -> Usage:
    """The counters summed: a pod's usage is its containers' together. Limits and
    pressure belong to one cgroup and cannot be summed; the caller reads the pod's."""
    return Usage(**{f: getattr(a, f) + getattr(b, f) for f in _COUNTERS})
