"""A cgroup's facts from cgroupfs, on v1, v2 and hybrid hosts.

The one place that knows the hierarchies, where a cgroup lies in each, the format of
each kernel file and each v1/v2 difference; it imports nothing of pycri, so the stats,
the metrics, the pod cgroups and the leftover killer all stand on it.

The OCI `cgroupsPath` is turned into directories the same way the runtimes do:
cgroupfs paths are used as they are; systemd's `slice:prefix:name` becomes
`<slice hierarchy>/<prefix>-<name>.scope`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PSI_RESOURCES = ("cpu", "memory", "io")
# Limits above this are "no limit": the kernel's own maximum is LONG_MAX rounded down to
# a page, and v2 writes "max".
UNLIMITED = 1 << 62


# -- the hierarchies -------------------------------------------------------------------


def is_v2(root: Path | str = CGROUP_ROOT) -> bool:
    """A pure v2 host: one hierarchy at the root, every controller in it."""
    return os.path.exists(f"{root}/cgroup.controllers")


def mode(root: Path | str = CGROUP_ROOT) -> str:
    """'v2' (unified), 'hybrid' (v1 controllers + a v2 mount) or 'v1'."""
    if is_v2(root):
        return "v2"
    if os.path.exists(f"{root}/unified/cgroup.controllers"):
        return "hybrid"
    return "v1"


def v2_controllers(root: Path | str = CGROUP_ROOT) -> list[str]:
    """Controllers bound to the v2 hierarchy (on a hybrid host, the 'unified' mount)."""
    for f in (f"{root}/cgroup.controllers", f"{root}/unified/cgroup.controllers"):
        if os.path.exists(f):
            return read_text(f).split()
    return []


# -- where a cgroup lies ---------------------------------------------------------------


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


# -- file formats ----------------------------------------------------------------------


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


def read_optional(path: str) -> int | None:
    """A single-value file's number; None for no such file (or not a number: "max")."""
    try:
        return int(read_text(path).split()[0])
    except (ValueError, IndexError):
        return None


def read_count(path: str) -> int:
    """A single-value counter or gauge; 0 for no such file, "max" or a negative value."""
    return max(0, read_optional(path) or 0)


def read_limit(path: str) -> int | None:
    """A limit file; None for "max", no limit, or no such file."""
    value = read_optional(path)
    return value if value is not None and 0 <= value <= UNLIMITED else None


def read_pids(path: str) -> list[int]:
    """cgroup.procs, cgroup.threads or tasks: one pid a line."""
    return [int(p) for p in read_text(path).split() if p.isdigit()]


def parse_keyed(text: str) -> dict[str, int]:
    """A flat keyed file ("key value" a line: memory.stat, cpu.stat, memory.events...);
    a line whose value is no number is left out."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


@dataclass(frozen=True)
class PsiLine:
    """One line ("some" or "full") of a *.pressure file."""

    total_us: int  # cumulative stall time, in microseconds as the kernel counts it
    avg10: float
    avg60: float
    avg300: float


Pressure = Mapping[str, Mapping[str, PsiLine]]  # resource (cpu/memory/io) -> some/full -> line


def parse_pressure(text: str) -> dict[str, PsiLine]:
    """A PSI file, nested keyed ("some avg10=0.12 avg60=.. avg300=.. total=USEC" /
    "full ..."), by kind; a line without a total is left out."""
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


@dataclass(frozen=True)
class IoEntry:
    major: int
    minor: int
    op: str  # Read, Write, Sync, Async, Discard, Total (cAdvisor's operation names)
    value: int


def parse_blkio_v1(text: str) -> list[IoEntry]:
    """blkio.*io_service_bytes / io_serviced: "MAJ:MIN Op N" lines; the bare "Total" dropped."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 3 or ":" not in fields[0]:
            continue
        major, _, minor = fields[0].partition(":")
        out.append(IoEntry(int(major), int(minor), fields[1], int(fields[2])))
    return out


_V2_IO = {"rbytes": ("Read", True), "wbytes": ("Write", True), "dbytes": ("Discard", True),
          "rios": ("Read", False), "wios": ("Write", False), "dios": ("Discard", False)}


def parse_io_stat(text: str) -> tuple[list[IoEntry], list[IoEntry]]:
    """v2 io.stat, nested keyed ("MAJ:MIN rbytes=.. wbytes=.. rios=.. ..."): (bytes,
    operations)."""
    nbytes: list[IoEntry] = []
    ops: list[IoEntry] = []
    for line in text.splitlines():
        dev, *pairs = line.split()
        if ":" not in dev:
            continue
        major, _, minor = dev.partition(":")
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key in _V2_IO and value.isdigit():
                op, is_bytes = _V2_IO[key]
                (nbytes if is_bytes else ops).append(
                    IoEntry(int(major), int(minor), op, int(value)))
    return nbytes, ops


# -- one cgroup ------------------------------------------------------------------------


class Cgroup:
    """One cgroup as this host lays it out, read on demand.

    Each fact below knows its v1 and its v2 file, read when the fact is asked; a file
    several facts share (memory.stat, cpu.stat, memory.events) and a fact others
    derive from are kept, so one Cgroup is one sample: the stats open only the files
    they use, the metrics no file twice. A cgroup that is gone reads as zeros (None or
    empty where a fact is optional). Blocking file I/O: use it in a worker thread.
    """

    def __init__(self, rel: str, root: Path | str = CGROUP_ROOT) -> None:
        self.root, self.rel, self.v2 = str(root), rel, is_v2(root)

    @classmethod
    def of(cls, cgroups_path: str, root: Path | str = CGROUP_ROOT) -> Cgroup:
        """The cgroup of an OCI `cgroupsPath`."""
        return cls(relative_dir(cgroups_path), root)

    def dir(self, controller: str) -> str:
        """Its directory for `controller`: v1 has a hierarchy per controller, v2 one."""
        if self.v2:
            return f"{self.root}/{self.rel}"
        return f"{self.root}/{controller}/{self.rel}"

    @property
    def unified(self) -> str:
        """Its directory on the v2 hierarchy: the root itself on a pure v2 host, its
        `unified` mount on a hybrid one (where runc and crun put the same path). On a
        pure v1 host it does not exist, and readers find nothing there."""
        return self.dir("unified")

    def file(self, controller: str, v1: str, v2: str = "") -> str:
        """The path of `controller`'s file named `v1`, or `v2` on v2 if it differs."""
        return f"{self.dir(controller)}/{v2 if v2 and self.v2 else v1}"

    def dirs(self) -> list[Path]:
        """Its directory in every mounted hierarchy, whether there or not."""
        root = Path(self.root)
        if self.v2:
            return [root / self.rel]
        return [h / self.rel for h in root.iterdir() if h.is_dir() and not h.is_symlink()]

    # -- cpu ----------------------------------------------------------------------------

    @cached_property
    def _cpu_stat(self) -> dict[str, int]:
        """v2: usage, user, system and throttling; v1 (cpu controller): throttling."""
        return parse_keyed(read_text(self.file("cpu", "cpu.stat")))

    @cached_property
    def _cpuacct_stat(self) -> dict[str, int]:
        """v1: user and system time, in USER_HZ ticks."""
        return parse_keyed(read_text(self.file("cpuacct", "cpuacct.stat")))

    def _cpu_time(self, kind: str) -> int:
        """"user" or "system" time in ns."""
        if self.v2:
            return self._cpu_stat.get(f"{kind}_usec", 0) * 1000
        return self._cpuacct_stat.get(kind, 0) * 10**9 // os.sysconf("SC_CLK_TCK")

    @cached_property
    def cpu_ns(self) -> int:
        """Cumulative CPU time."""
        if self.v2:
            return self._cpu_stat.get("usage_usec", 0) * 1000
        return read_count(self.file("cpuacct", "cpuacct.usage"))

    @property
    def cpu_user_ns(self) -> int:
        return self._cpu_time("user")

    @property
    def cpu_system_ns(self) -> int:
        return self._cpu_time("system")

    @property
    def cpu_periods(self) -> int:
        """Elapsed CFS enforcement periods."""
        return self._cpu_stat.get("nr_periods", 0)

    @property
    def cpu_throttled_periods(self) -> int:
        return self._cpu_stat.get("nr_throttled", 0)

    @property
    def cpu_throttled_ns(self) -> int:
        if self.v2:
            return self._cpu_stat.get("throttled_usec", 0) * 1000
        return self._cpu_stat.get("throttled_time", 0)

    # -- memory -------------------------------------------------------------------------

    @cached_property
    def _memory_stat(self) -> dict[str, int]:
        return parse_keyed(read_text(self.file("memory", "memory.stat")))

    def _stat(self, v1: str, v2: str) -> int:
        """A memory.stat entry by its v1 and v2 names; v1's hierarchical ones are total_*."""
        return self._memory_stat.get(v2 if self.v2 else v1, 0)

    @cached_property
    def _memory_events(self) -> dict[str, int]:
        """v2 only: memory.events (limit hits as `max`, OOM kills)."""
        return parse_keyed(read_text(self.file("memory", "memory.events")))

    @cached_property
    def memory_usage(self) -> int:
        """Usage including page cache."""
        return read_count(self.file("memory", "memory.usage_in_bytes", "memory.current"))

    @property
    def memory_peak(self) -> int:
        return read_count(self.file("memory", "memory.max_usage_in_bytes", "memory.peak"))

    @property
    def working_set(self) -> int:
        """Usage minus inactive file pages (what eviction watches)."""
        return max(0, self.memory_usage - self._stat("total_inactive_file", "inactive_file"))

    @property
    def rss(self) -> int:
        """Anonymous (and swap cache) memory."""
        return self._stat("total_rss", "anon")

    @property
    def cache(self) -> int:
        return self._stat("total_cache", "file")

    @property
    def mapped_file(self) -> int:
        return self._stat("total_mapped_file", "file_mapped")

    @property
    def kernel(self) -> int:
        """Kernel memory charged to the cgroup (v1 has a file of its own)."""
        if self.v2:
            stat = self._memory_stat
            return stat.get("kernel", stat.get("kernel_stack", 0) + stat.get("slab", 0))
        return read_count(self.file("memory", "memory.kmem.usage_in_bytes"))

    @property
    def failcnt(self) -> int:
        """How often the memory limit was hit."""
        if self.v2:
            return self._memory_events.get("max", 0)
        return read_count(self.file("memory", "memory.failcnt"))

    @property
    def oom_kills(self) -> int:
        """Processes the OOM killer killed here."""
        if self.v2:
            return self._memory_events.get("oom_kill", 0)
        return parse_keyed(read_text(self.file("memory", "memory.oom_control"))).get(
            "oom_kill", 0)

    @cached_property
    def faults(self) -> dict[tuple[str, str], int]:
        """(pgfault or pgmajfault, scope) -> count; scope "container" is this cgroup
        alone, "hierarchy" with its children. v2 counts the whole subtree only."""
        out: dict[tuple[str, str], int] = {}
        for kind in ("pgfault", "pgmajfault"):
            out[(kind, "container")] = self._memory_stat.get(kind, 0)
            out[(kind, "hierarchy")] = self._stat(f"total_{kind}", kind)
        return out

    @cached_property
    def memory_limit(self) -> int | None:
        """None: no limit."""
        return read_limit(self.file("memory", "memory.limit_in_bytes", "memory.max"))

    @property
    def swap(self) -> int | None:
        """None: no swap accounting (v1: total_swap is in memory.stat only with it)."""
        if self.v2:
            return read_optional(self.file("memory", "memory.swap.current"))
        return self._memory_stat.get("total_swap")

    @property
    def swap_limit(self) -> int | None:
        """Swap alone (v1: memory plus swap minus memory); None: no limit."""
        if self.v2:
            return read_limit(self.file("memory", "memory.swap.max"))
        memsw = read_limit(self.file("memory", "memory.memsw.limit_in_bytes"))
        limit = self.memory_limit
        return None if limit is None or memsw is None else max(0, memsw - limit)

    # -- pids, hugetlb, io, pressure ----------------------------------------------------

    @property
    def processes(self) -> int:
        """The pids controller's count (pids.current)."""
        return read_count(self.file("pids", "pids.current"))

    @property
    def procs(self) -> list[int]:
        return read_pids(self.file("pids", "cgroup.procs"))

    @property
    def threads(self) -> int:
        return len(read_pids(self.file("pids", "tasks", "cgroup.threads")))

    @property
    def threads_max(self) -> int:
        """The pids limit; 0 for none ("max")."""
        return read_count(self.file("pids", "pids.max"))

    @property
    def hugetlb(self) -> dict[str, tuple[int, int | None]]:
        """Page size ("2MB") -> (usage, peak); v2 keeps no peak (None)."""
        d = Path(self.dir("hugetlb"))
        out: dict[str, tuple[int, int | None]] = {}
        if self.v2:
            for f in sorted(d.glob("hugetlb.*.current")):
                out[f.name.split(".")[1]] = (read_count(str(f)), None)
        elif d.is_dir():
            for f in sorted(d.glob("hugetlb.*.usage_in_bytes")):
                size = f.name.split(".")[1]
                out[size] = (read_count(str(f)),
                             read_count(f"{d}/hugetlb.{size}.max_usage_in_bytes"))
        return out

    @property
    def io(self) -> tuple[list[IoEntry], list[IoEntry]]:
        """Block I/O per device: (bytes, operations)."""
        if self.v2:
            return parse_io_stat(read_text(self.file("io", "io.stat")))
        blkio = self.dir("blkio")
        return (parse_blkio_v1(read_text(f"{blkio}/blkio.throttle.io_service_bytes_recursive")),
                parse_blkio_v1(read_text(f"{blkio}/blkio.throttle.io_serviced_recursive")))

    @property
    def pressure(self) -> dict[str, dict[str, PsiLine]]:
        """PSI, a v2 file even on a hybrid host (its unified mount); none on pure v1."""
        return read_pressure(self.unified)
