"""Read a container's CPU and memory usage from its cgroup (v1, v2 or hybrid hosts).

The OCI `cgroupsPath` is turned into directories the same way the runtimes do:
cgroupfs paths are used as they are; systemd's `slice:prefix:name` becomes
`<slice hierarchy>/<prefix>-<name>.scope`.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Usage:
    cpu_ns: int = 0  # cumulative CPU time
    memory_bytes: int = 0  # usage including page cache
    working_set_bytes: int = 0  # usage minus inactive file pages (what eviction watches)
    rss_bytes: int = 0
    page_faults: int = 0
    major_page_faults: int = 0
    processes: int = 0


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


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _read_kv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def read_usage(cgroups_path: str, root: Path = CGROUP_ROOT) -> Usage:
    """Current usage; zeros for a cgroup that is gone (an exited container)."""
    rel = relative_dir(cgroups_path)
    if (root / "cgroup.controllers").exists():  # pure v2
        return _v2(root / rel)
    return _v1(root, rel)


def _v2(d: Path) -> Usage:
    cpu = _read_kv(d / "cpu.stat")
    mem = _read_kv(d / "memory.stat")
    current = _read_int(d / "memory.current")
    return Usage(
        cpu_ns=cpu.get("usage_usec", 0) * 1000,
        memory_bytes=current,
        working_set_bytes=max(0, current - mem.get("inactive_file", 0)),
        rss_bytes=mem.get("anon", 0),
        page_faults=mem.get("pgfault", 0),
        major_page_faults=mem.get("pgmajfault", 0),
        processes=_read_int(d / "pids.current"),
    )


def _v1(root: Path, rel: str) -> Usage:
    mem_dir = root / "memory" / rel
    mem = _read_kv(mem_dir / "memory.stat")
    usage = _read_int(mem_dir / "memory.usage_in_bytes")
    return Usage(
        cpu_ns=_read_int(root / "cpuacct" / rel / "cpuacct.usage"),
        memory_bytes=usage,
        working_set_bytes=max(0, usage - mem.get("total_inactive_file", 0)),
        rss_bytes=mem.get("total_rss", 0),
        page_faults=mem.get("total_pgfault", 0),
        major_page_faults=mem.get("total_pgmajfault", 0),
        processes=_read_int(root / "pids" / rel / "pids.current"),
    )


def add(a: Usage, b: Usage) -> Usage:
    """Field-wise sum: a pod's usage is its containers' together."""
    return Usage(*(x + y for x, y in zip(astuple(a), astuple(b), strict=True)))
