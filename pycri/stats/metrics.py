"""CRI metrics (ListMetricDescriptors / ListPodSandboxMetrics) under cAdvisor's names.

The kubelet exports these samples on `/metrics/cadvisor` as they are, so the names,
label keys and units follow cAdvisor. Every container metric carries the labels
pod, namespace, container, id, image; network metrics are pod-level (the pod
shares one network namespace) with container and image left empty.
CRI values are unsigned integers, so seconds are whole seconds (truncated).

Values are read from the container's cgroup (through pycri/cgroups.py, which knows
v1 and v2), /proc of its processes,
the writable layer and the filesystem holding it, and the infra process's
/proc/<pid>/net/dev. The parsers are pure functions on file contents.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pycri.cgroups import CGROUP_ROOT, Cgroup, IoEntry, read_text
from pycri.stats import netdev
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox

COUNTER, GAUGE = "counter", "gauge"
BASE_LABELS = ("pod", "namespace", "container", "id", "image")
NS_PER_S = 10**9


@dataclass(frozen=True)
class Descriptor:
    name: str
    help: str
    kind: str
    extra_labels: tuple[str, ...] = ()

    @property
    def label_keys(self) -> tuple[str, ...]:
        return BASE_LABELS + self.extra_labels


_DEV = ("device",)
_NET = ("interface",)

DESCRIPTORS: tuple[Descriptor, ...] = (
    Descriptor("container_cpu_usage_seconds_total", "Cumulative CPU time consumed, in seconds",
               COUNTER),
    Descriptor("container_cpu_user_seconds_total", "Cumulative user CPU time, in seconds",
               COUNTER),
    Descriptor("container_cpu_system_seconds_total", "Cumulative system CPU time, in seconds",
               COUNTER),
    Descriptor("container_cpu_cfs_periods_total", "Number of elapsed CFS enforcement periods",
               COUNTER),
    Descriptor("container_cpu_cfs_throttled_periods_total",
               "Number of CFS periods in which the container was throttled", COUNTER),
    Descriptor("container_cpu_cfs_throttled_seconds_total",
               "Total time the container was throttled, in seconds", COUNTER),
    Descriptor("container_memory_usage_bytes",
               "Current memory usage including page cache, in bytes", GAUGE),
    Descriptor("container_memory_max_usage_bytes", "Highest memory usage recorded, in bytes",
               GAUGE),
    Descriptor("container_memory_working_set_bytes",
               "Memory usage minus inactive file pages, in bytes", GAUGE),
    Descriptor("container_memory_cache", "Page cache memory, in bytes", GAUGE),
    Descriptor("container_memory_rss", "Anonymous and swap cache memory, in bytes", GAUGE),
    Descriptor("container_memory_mapped_file", "Memory-mapped file pages, in bytes", GAUGE),
    Descriptor("container_memory_swap", "Swap usage, in bytes", GAUGE),
    Descriptor("container_memory_kernel_usage", "Kernel memory charged to the container, in bytes",
               GAUGE),
    Descriptor("container_memory_failcnt", "Number of times the memory limit was hit", COUNTER),
    Descriptor("container_memory_failures_total", "Cumulative count of memory page faults",
               COUNTER, ("failure_type", "scope")),
    Descriptor("container_oom_events_total", "Number of processes killed by the OOM killer",
               COUNTER),
    Descriptor("container_hugetlb_usage_bytes", "Current hugepage usage, in bytes", GAUGE,
               ("pagesize",)),
    Descriptor("container_hugetlb_max_usage_bytes", "Highest hugepage usage recorded, in bytes",
               GAUGE, ("pagesize",)),
    Descriptor("container_pressure_cpu_stalled_seconds_total",
               "Time all non-idle tasks were stalled on CPU, in seconds", COUNTER),
    Descriptor("container_pressure_cpu_waiting_seconds_total",
               "Time some tasks waited for CPU, in seconds", COUNTER),
    Descriptor("container_pressure_memory_stalled_seconds_total",
               "Time all non-idle tasks were stalled on memory, in seconds", COUNTER),
    Descriptor("container_pressure_memory_waiting_seconds_total",
               "Time some tasks waited for memory, in seconds", COUNTER),
    Descriptor("container_pressure_io_stalled_seconds_total",
               "Time all non-idle tasks were stalled on I/O, in seconds", COUNTER),
    Descriptor("container_pressure_io_waiting_seconds_total",
               "Time some tasks waited for I/O, in seconds", COUNTER),
    Descriptor("container_network_receive_bytes_total", "Bytes received", COUNTER, _NET),
    Descriptor("container_network_receive_packets_total", "Packets received", COUNTER, _NET),
    Descriptor("container_network_receive_packets_dropped_total",
               "Received packets dropped", COUNTER, _NET),
    Descriptor("container_network_receive_errors_total", "Errors while receiving", COUNTER,
               _NET),
    Descriptor("container_network_transmit_bytes_total", "Bytes transmitted", COUNTER, _NET),
    Descriptor("container_network_transmit_packets_total", "Packets transmitted", COUNTER,
               _NET),
    Descriptor("container_network_transmit_packets_dropped_total",
               "Packets dropped while transmitting", COUNTER, _NET),
    Descriptor("container_network_transmit_errors_total", "Errors while transmitting", COUNTER,
               _NET),
    Descriptor("container_fs_usage_bytes", "Bytes used by the container's writable layer",
               GAUGE, _DEV),
    Descriptor("container_fs_limit_bytes",
               "Size of the filesystem holding the writable layer, in bytes", GAUGE, _DEV),
    Descriptor("container_fs_inodes_total",
               "Inodes of the filesystem holding the writable layer", GAUGE, _DEV),
    Descriptor("container_fs_inodes_free",
               "Free inodes of the filesystem holding the writable layer", GAUGE, _DEV),
    Descriptor("container_fs_reads_bytes_total", "Bytes read from a block device", COUNTER,
               _DEV),
    Descriptor("container_fs_reads_total", "Reads completed on a block device", COUNTER, _DEV),
    Descriptor("container_fs_writes_bytes_total", "Bytes written to a block device", COUNTER,
               _DEV),
    Descriptor("container_fs_writes_total", "Writes completed on a block device", COUNTER,
               _DEV),
    Descriptor("container_blkio_device_usage_total", "Block I/O bytes per device and operation",
               COUNTER, ("device", "major", "minor", "operation")),
    Descriptor("container_processes", "Number of processes in the container", GAUGE),
    Descriptor("container_threads", "Number of threads in the container", GAUGE),
    Descriptor("container_threads_max", "Task limit of the container (0: unlimited)", GAUGE),
    Descriptor("container_file_descriptors", "Open file descriptors of the container's processes",
               GAUGE),
    Descriptor("container_sockets", "Open sockets of the container's processes", GAUGE),
    Descriptor("container_ulimits_soft", "Soft resource limit of the container's main process",
               GAUGE, ("ulimit",)),
    Descriptor("container_last_seen", "When this sample was taken, in seconds since the epoch",
               GAUGE),
    Descriptor("container_start_time_seconds",
               "When the container started, in seconds since the epoch", GAUGE),
    Descriptor("container_spec_cpu_period", "CFS period of the container, in microseconds",
               GAUGE),
    Descriptor("container_spec_cpu_quota", "CFS quota of the container, in microseconds", GAUGE),
    Descriptor("container_spec_cpu_shares", "CPU shares of the container", GAUGE),
    Descriptor("container_spec_memory_limit_bytes", "Memory limit (0: unlimited), in bytes",
               GAUGE),
    Descriptor("container_spec_memory_swap_limit_bytes",
               "Memory plus swap limit (0: unlimited), in bytes", GAUGE),
)
BY_NAME = {d.name: d for d in DESCRIPTORS}


@dataclass(frozen=True)
class Sample:
    name: str
    kind: str
    labels: tuple[str, ...]  # one value per label key of the descriptor
    value: int
    timestamp: int


@dataclass(frozen=True)
class ContainerMetrics:
    container_id: str
    samples: list[Sample]


@dataclass(frozen=True)
class PodMetrics:
    sandbox_id: str
    samples: list[Sample]  # pod-level (network)
    containers: list[ContainerMetrics]


class _Emitter:
    """Builds samples for one label set; checks each has as many labels as its descriptor."""

    def __init__(self, base: tuple[str, ...], timestamp: int) -> None:
        self.base, self.timestamp = base, timestamp
        self.samples: list[Sample] = []

    def __call__(self, name: str, value: int, *extra: str) -> None:
        d = BY_NAME[name]
        labels = self.base + extra
        if len(labels) != len(d.label_keys):
            raise ValueError(f"{name}: {len(labels)} label values for {len(d.label_keys)} keys")
        self.samples.append(Sample(name, d.kind, labels, max(0, value), self.timestamp))


# -- pure parsers ----------------------------------------------------------------------


def parse_soft_nofile(limits: str) -> int | None:
    """Soft "Max open files" from /proc/<pid>/limits (what cAdvisor reports)."""
    for line in limits.splitlines():
        if line.startswith("Max open files"):
            soft = line[len("Max open files"):].split()[0]
            return int(soft) if soft.isdigit() else None
    return None


def mount_source(mountinfo: str, major: int, minor: int) -> str:
    """The source of the first mount of device MAJ:MIN in /proc/self/mountinfo, else "M:m"."""
    dev = f"{major}:{minor}"
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == dev and " - " in line:
            after = line.split(" - ", 1)[1].split()
            if len(after) >= 2:
                return after[1]
    return dev


# -- /proc of the container's processes -------------------------------------------------


def count_fds(pids: Sequence[int], proc: Path = Path("/proc")) -> tuple[int, int]:
    """(open file descriptors, of which sockets) over `pids`; a process that exits is skipped."""
    fds = sockets = 0
    for pid in pids:
        with contextlib.suppress(OSError), os.scandir(proc / str(pid) / "fd") as it:
            for e in it:
                fds += 1
                with contextlib.suppress(OSError):
                    if os.readlink(e.path).startswith("socket:"):
                        sockets += 1
    return fds, sockets


def block_device_name(major: int, minor: int, sys_root: Path = Path("/sys")) -> str:
    """/dev/<DEVNAME> of a block device from sysfs, else "MAJ:MIN"."""
    uevent = read_text(sys_root / "dev" / "block" / f"{major}:{minor}" / "uevent")
    for line in uevent.splitlines():
        if line.startswith("DEVNAME="):
            return "/dev/" + line.removeprefix("DEVNAME=")
    return f"{major}:{minor}"


# -- samples of a pod ------------------------------------------------------------------


def _resource(resources: dict[str, Any], key: str) -> int:
    """A LinuxContainerResources field from the record (protobuf JSON writes int64 as text)."""
    try:
        return max(0, int(resources.get(key, 0)))
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class Filesystem:
    """The filesystem holding the writable layers (the image root)."""

    device: str
    size: int
    inodes: int
    inodes_free: int


def filesystem(root: Path) -> Filesystem:
    """The filesystem holding `root` (the image root), with its mount's source as name."""
    st, vfs = os.stat(root), os.statvfs(root)
    device = mount_source(read_text(Path("/proc/self/mountinfo")), os.major(st.st_dev),
                          os.minor(st.st_dev))
    return Filesystem(device, vfs.f_blocks * vfs.f_frsize, vfs.f_files, vfs.f_favail)


def pod_metrics(sb: Sandbox, containers: Sequence[tuple[Container, int, str]],
                fs: Filesystem, cgroup_root: Path = CGROUP_ROOT) -> PodMetrics:
    """The samples of one pod: its network, then each container with the bytes of its
    writable layer (which the caller measured) and its image's name (the `image` label:
    a tag, as cAdvisor's series have it, not the image ID a kubelet creates by)."""
    md = sb.config.metadata
    emit = _Emitter((md.name, md.namespace, "", sb.id, ""), time.time_ns())
    if not sb.host_network:
        for i in netdev.interfaces(sb.infra_pid):
            emit("container_network_receive_bytes_total", i.rx_bytes, i.name)
            emit("container_network_receive_packets_total", i.rx_packets, i.name)
            emit("container_network_receive_packets_dropped_total", i.rx_dropped, i.name)
            emit("container_network_receive_errors_total", i.rx_errors, i.name)
            emit("container_network_transmit_bytes_total", i.tx_bytes, i.name)
            emit("container_network_transmit_packets_total", i.tx_packets, i.name)
            emit("container_network_transmit_packets_dropped_total", i.tx_dropped, i.name)
            emit("container_network_transmit_errors_total", i.tx_errors, i.name)
    return PodMetrics(sb.id, emit.samples,
                      [_container(sb, c, used, image, fs, cgroup_root)
                       for c, used, image in containers])


def _container(sb: Sandbox, c: Container, used: int, image: str, fs: Filesystem,
               cgroup_root: Path) -> ContainerMetrics:
    md = sb.config.metadata
    now = time.time_ns()
    emit = _Emitter((md.name, md.namespace, c.config.metadata.name, c.id, image), now)
    cg = Cgroup.of(c.cgroups_path, cgroup_root)
    _emit_cpu_memory(emit, cg)
    _emit_io(emit, cg)
    emit("container_fs_usage_bytes", used, fs.device)
    emit("container_fs_limit_bytes", fs.size, fs.device)
    emit("container_fs_inodes_total", fs.inodes, fs.device)
    emit("container_fs_inodes_free", fs.inodes_free, fs.device)
    procs = cg.procs
    fds, sockets = count_fds(procs)
    emit("container_processes", len(procs))
    emit("container_threads", cg.threads)
    emit("container_threads_max", cg.threads_max)
    emit("container_file_descriptors", fds)
    emit("container_sockets", sockets)
    nofile = parse_soft_nofile(read_text(Path(f"/proc/{c.pid}/limits"))) if c.pid else None
    if nofile is not None:
        emit("container_ulimits_soft", nofile, "max_open_files")
    emit("container_last_seen", now // NS_PER_S)
    if c.started_at:
        emit("container_start_time_seconds", c.started_at // NS_PER_S)
    res = c.resources
    emit("container_spec_cpu_period", _resource(res, "cpu_period"))
    if _resource(res, "cpu_quota"):
        emit("container_spec_cpu_quota", _resource(res, "cpu_quota"))
    emit("container_spec_cpu_shares", _resource(res, "cpu_shares"))
    emit("container_spec_memory_limit_bytes", _resource(res, "memory_limit_in_bytes"))
    emit("container_spec_memory_swap_limit_bytes",
         _resource(res, "memory_swap_limit_in_bytes"))
    return ContainerMetrics(c.id, emit.samples)


def _emit_cpu_memory(emit: _Emitter, cg: Cgroup) -> None:
    emit("container_cpu_usage_seconds_total", cg.cpu_ns // NS_PER_S)
    emit("container_cpu_user_seconds_total", cg.cpu_user_ns // NS_PER_S)
    emit("container_cpu_system_seconds_total", cg.cpu_system_ns // NS_PER_S)
    emit("container_cpu_cfs_periods_total", cg.cpu_periods)
    emit("container_cpu_cfs_throttled_periods_total", cg.cpu_throttled_periods)
    emit("container_cpu_cfs_throttled_seconds_total", cg.cpu_throttled_ns // NS_PER_S)
    emit("container_memory_usage_bytes", cg.memory_usage)
    emit("container_memory_max_usage_bytes", cg.memory_peak)
    emit("container_memory_working_set_bytes", cg.working_set)
    emit("container_memory_cache", cg.cache)
    emit("container_memory_rss", cg.rss)
    emit("container_memory_mapped_file", cg.mapped_file)
    emit("container_memory_swap", cg.swap or 0)
    emit("container_memory_kernel_usage", cg.kernel)
    emit("container_memory_failcnt", cg.failcnt)
    emit("container_oom_events_total", cg.oom_kills)
    for (kind, scope), n in sorted(cg.faults.items()):
        emit("container_memory_failures_total", n, kind, scope)
    for size, (usage, peak) in sorted(cg.hugetlb.items()):
        emit("container_hugetlb_usage_bytes", usage, size)
        if peak is not None:
            emit("container_hugetlb_max_usage_bytes", peak, size)
    for res, psi in sorted(cg.pressure.items()):
        if "full" in psi:
            emit(f"container_pressure_{res}_stalled_seconds_total", psi["full"].total_us // 10**6)
        if "some" in psi:
            emit(f"container_pressure_{res}_waiting_seconds_total", psi["some"].total_us // 10**6)


def _emit_io(emit: _Emitter, cg: Cgroup) -> None:
    """Per-device block I/O; nothing when the kernel accounted no device for the cgroup."""
    names: dict[tuple[int, int], str] = {}

    def name(e: IoEntry) -> str:
        key = (e.major, e.minor)
        if key not in names:
            names[key] = block_device_name(e.major, e.minor)
        return names[key]

    per_op = {("bytes", "Read"): "container_fs_reads_bytes_total",
              ("bytes", "Write"): "container_fs_writes_bytes_total",
              ("ops", "Read"): "container_fs_reads_total",
              ("ops", "Write"): "container_fs_writes_total"}
    io_bytes, io_ops = cg.io
    for unit, entries in (("bytes", io_bytes), ("ops", io_ops)):
        for e in entries:
            metric = per_op.get((unit, e.op))
            if metric:
                emit(metric, e.value, name(e))
    for e in io_bytes:
        emit("container_blkio_device_usage_total", e.value, name(e), str(e.major), str(e.minor),
             e.op)
