"""Metrics parsers and cgroup readers on sample file contents (v1 and v2 layouts)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from pycri.stats import metrics, netdev
from pycri.stats.cgroups import PsiLine, parse_pressure
from pycri.stats.metrics import IoEntry

NET_DEV = (
    "Inter-|   Receive                  |  Transmit\n"
    " face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop"
    " fifo colls carrier compressed\n"
    "    lo: 1000 10 0 0 0 0 0 0 1000 10 0 0 0 0 0 0\n"
    "  eth0: 5000 40 1 2 0 0 0 0 3000 30 3 4 0 0 0 0\n"
)


def test_netdev_packets_and_drops() -> None:
    [eth0] = netdev.parse(NET_DEV)
    assert eth0 == netdev.Interface("eth0", rx_bytes=5000, rx_errors=1, tx_bytes=3000,
                                    tx_errors=3, rx_packets=40, rx_dropped=2, tx_packets=30,
                                    tx_dropped=4)


def test_descriptors_are_unique_and_described() -> None:
    names = [d.name for d in metrics.DESCRIPTORS]
    assert len(names) == len(set(names))
    for d in metrics.DESCRIPTORS:
        assert d.help and d.label_keys[:5] == metrics.BASE_LABELS
        counter = d.name.endswith(("_total", "_failcnt")) and d.name != (
            "container_fs_inodes_total")  # a filesystem's inode count, not an event count
        assert d.kind == (metrics.COUNTER if counter else metrics.GAUGE), d.name


def test_emitter_refuses_wrong_label_count() -> None:
    emit = metrics._Emitter(("p", "ns", "c", "id", "img"), 7)
    emit("container_memory_rss", 5)
    emit("container_memory_failures_total", 9, "pgfault", "container")
    emit("container_memory_swap", -1)  # never negative on the wire
    assert [(s.name, s.labels[5:], s.value, s.timestamp) for s in emit.samples] == [
        ("container_memory_rss", (), 5, 7),
        ("container_memory_failures_total", ("pgfault", "container"), 9, 7),
        ("container_memory_swap", (), 0, 7),
    ]
    with pytest.raises(ValueError, match="6 label values for 7 keys"):
        emit("container_memory_failures_total", 1, "pgfault")


def test_parse_keyed_and_limit() -> None:
    assert metrics.parse_keyed("nr_periods 12\nnr_throttled 3\nbad x\n") == {
        "nr_periods": 12, "nr_throttled": 3}
    assert metrics.parse_limit("max\n") == 0
    assert metrics.parse_limit("4096\n") == 4096
    assert metrics.parse_limit("") == 0


def test_parse_blkio_v1() -> None:
    text = "8:0 Read 4096\n8:0 Write 8192\n8:0 Total 12288\nTotal 12288\n"
    assert metrics.parse_blkio_v1(text) == [
        IoEntry(8, 0, "Read", 4096), IoEntry(8, 0, "Write", 8192), IoEntry(8, 0, "Total", 12288)]
    assert metrics.parse_blkio_v1("Total 0\n") == []


def test_parse_io_stat_v2() -> None:
    nbytes, ops = metrics.parse_io_stat(
        "254:0 rbytes=100 wbytes=200 rios=1 wios=2 dbytes=0 dios=0\n")
    assert nbytes == [IoEntry(254, 0, "Read", 100), IoEntry(254, 0, "Write", 200),
                      IoEntry(254, 0, "Discard", 0)]
    assert ops == [IoEntry(254, 0, "Read", 1), IoEntry(254, 0, "Write", 2),
                   IoEntry(254, 0, "Discard", 0)]


def test_parse_pressure_and_limits() -> None:
    psi = ("some avg10=0.00 avg60=0.00 avg300=0.00 total=2500000\n"
           "full avg10=0.00 avg60=0.00 avg300=0.00 total=1000\n")
    assert parse_pressure(psi) == {"some": PsiLine(2500000, 0, 0, 0),
                                   "full": PsiLine(1000, 0, 0, 0)}
    limits = ("Limit                     Soft Limit           Hard Limit           Units\n"
              "Max open files            1024                 4096                 files\n")
    assert metrics.parse_soft_nofile(limits) == 1024
    assert metrics.parse_soft_nofile(limits.replace("1024", "unlimited")) is None
    assert metrics.parse_soft_nofile("") is None


def test_mount_source() -> None:
    info = ("22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
            "40 22 0:35 / /run rw shared:5 - tmpfs tmpfs rw\n")
    assert metrics.mount_source(info, 254, 0) == "/dev/vda"
    assert metrics.mount_source(info, 0, 35) == "tmpfs"
    assert metrics.mount_source(info, 8, 1) == "8:1"


def test_block_device_name(tmp_path: Path) -> None:
    dev = tmp_path / "dev" / "block" / "8:16"
    dev.mkdir(parents=True)
    (dev / "uevent").write_text("MAJOR=8\nMINOR=16\nDEVNAME=sdb\nDEVTYPE=disk\n")
    assert metrics.block_device_name(8, 16, tmp_path) == "/dev/sdb"
    assert metrics.block_device_name(8, 32, tmp_path) == "8:32"


def test_count_fds_of_a_real_process() -> None:
    fds, sockets = metrics.count_fds([os.getpid()])
    with socket.socket() as s:
        fds2, sockets2 = metrics.count_fds([os.getpid(), 2**22 + 1])  # no such pid: skipped
        assert s.fileno() >= 0
    assert fds2 >= fds + 1 and sockets2 == sockets + 1


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_read_cgroup_v1(tmp_path: Path) -> None:
    c = "pycri/pycri-abc"
    hz = os.sysconf("SC_CLK_TCK")
    _write(tmp_path, {
        f"cpuacct/{c}/cpuacct.usage": "3500000000\n",
        f"cpuacct/{c}/cpuacct.stat": f"user {2 * hz}\nsystem {hz}\n",
        f"cpu/{c}/cpu.stat": "nr_periods 50\nnr_throttled 20\nthrottled_time 2500000000\n",
        f"memory/{c}/memory.usage_in_bytes": "1000000\n",
        f"memory/{c}/memory.max_usage_in_bytes": "2000000\n",
        f"memory/{c}/memory.failcnt": "4\n",
        f"memory/{c}/memory.kmem.usage_in_bytes": "30000\n",
        f"memory/{c}/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        f"memory/{c}/memory.stat": (
            "pgfault 10\npgmajfault 1\ntotal_cache 400\ntotal_rss 500\ntotal_mapped_file 60\n"
            "total_swap 7\ntotal_inactive_file 100000\ntotal_pgfault 11\ntotal_pgmajfault 2\n"),
        f"hugetlb/{c}/hugetlb.2MB.usage_in_bytes": "2097152\n",
        f"hugetlb/{c}/hugetlb.2MB.max_usage_in_bytes": "4194304\n",
        f"blkio/{c}/blkio.throttle.io_service_bytes_recursive": "8:0 Read 4096\nTotal 4096\n",
        f"blkio/{c}/blkio.throttle.io_serviced_recursive": "8:0 Read 1\nTotal 1\n",
        f"pids/{c}/cgroup.procs": "100\n101\n",
        f"pids/{c}/tasks": "100\n101\n102\n",
        f"pids/{c}/pids.max": "max\n",
        f"unified/{c}/memory.pressure": "some avg10=1.50 avg60=0.00 avg300=0.00 total=2000000\n",
    })
    r = metrics.read_cgroup("/pycri/pycri-abc", tmp_path)
    assert (r.cpu_ns, r.user_ns, r.system_ns) == (3500000000, 2 * 10**9, 10**9)
    assert (r.periods, r.throttled_periods, r.throttled_ns) == (50, 20, 2500000000)
    assert (r.memory, r.max_memory, r.working_set) == (1000000, 2000000, 900000)
    assert (r.cache, r.rss, r.mapped_file, r.swap, r.kernel) == (400, 500, 60, 7, 30000)
    assert (r.failcnt, r.oom_kills) == (4, 2)
    assert r.faults == {("pgfault", "container"): 10, ("pgfault", "hierarchy"): 11,
                        ("pgmajfault", "container"): 1, ("pgmajfault", "hierarchy"): 2}
    assert r.hugetlb == {"2MB": (2097152, 4194304)}
    assert r.io_bytes == [IoEntry(8, 0, "Read", 4096)]
    assert r.io_ops == [IoEntry(8, 0, "Read", 1)]
    assert (r.procs, r.threads, r.threads_max) == ([100, 101], 3, 0)
    # A hybrid host keeps pressure on its v2 mount, at the same path.
    assert r.pressure == {"memory": {"some": PsiLine(2000000, 1.5, 0, 0)}}


def test_read_cgroup_v2(tmp_path: Path) -> None:
    c = "pycri.slice/pycri-abc.scope"
    _write(tmp_path, {
        "cgroup.controllers": "cpu memory io pids\n",
        f"{c}/cpu.stat": ("usage_usec 3000000\nuser_usec 2000000\nsystem_usec 1000000\n"
                          "nr_periods 9\nnr_throttled 4\nthrottled_usec 1500000\n"),
        f"{c}/memory.current": "5000\n",
        f"{c}/memory.peak": "9000\n",
        f"{c}/memory.swap.current": "12\n",
        f"{c}/memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        f"{c}/memory.stat": ("anon 100\nfile 200\nkernel 300\nfile_mapped 40\n"
                             "inactive_file 1000\npgfault 77\npgmajfault 5\n"),
        f"{c}/hugetlb.2MB.current": "0\n",
        f"{c}/cpu.pressure": ("some avg10=0 avg60=0 avg300=0 total=3000000\n"
                              "full avg10=0 avg60=0 avg300=0 total=1000000\n"),
        f"{c}/io.stat": "254:0 rbytes=10 wbytes=20 rios=1 wios=2 dbytes=0 dios=0\n",
        f"{c}/cgroup.procs": "7\n",
        f"{c}/cgroup.threads": "7\n8\n",
        f"{c}/pids.max": "512\n",
    })
    r = metrics.read_cgroup("pycri.slice:pycri:abc", tmp_path)
    assert (r.cpu_ns, r.user_ns, r.system_ns) == (3 * 10**9, 2 * 10**9, 10**9)
    assert (r.periods, r.throttled_periods, r.throttled_ns) == (9, 4, 1500000000)
    assert (r.memory, r.max_memory, r.working_set, r.swap) == (5000, 9000, 4000, 12)
    assert (r.cache, r.rss, r.mapped_file, r.kernel) == (200, 100, 40, 300)
    assert (r.failcnt, r.oom_kills) == (3, 1)
    assert r.faults[("pgfault", "hierarchy")] == r.faults[("pgfault", "container")] == 77
    assert r.hugetlb == {"2MB": (0, None)}
    assert r.pressure == {"cpu": {"some": PsiLine(3000000, 0, 0, 0),
                                  "full": PsiLine(1000000, 0, 0, 0)}}
    assert [e.op for e in r.io_bytes] == ["Read", "Write", "Discard"]
    assert (r.procs, r.threads, r.threads_max) == ([7], 2, 512)


def test_emitted_samples_from_a_reading() -> None:
    r = metrics.CgroupReading(cpu_ns=2_900_000_000,
                              pressure={"io": {"some": PsiLine(4_200_000, 1, 2, 3)}},
                              hugetlb={"2MB": (5, None)},
                              io_bytes=[IoEntry(2**20, 0, "Write", 64)])
    emit = metrics._Emitter(("p", "ns", "c", "id", "img"), 1)
    metrics._emit_cpu_memory(emit, r)
    metrics._emit_io(emit, r)
    got = {(s.name, s.labels[5:]): s.value for s in emit.samples}
    assert got[("container_cpu_usage_seconds_total", ())] == 2  # whole seconds
    assert got[("container_pressure_io_waiting_seconds_total", ())] == 4
    assert ("container_pressure_io_stalled_seconds_total", ()) not in got
    assert got[("container_hugetlb_usage_bytes", ("2MB",))] == 5
    assert not any(name == "container_hugetlb_max_usage_bytes" for name, _ in got)
    dev = f"{2**20}:0"  # no such block device: named by its numbers
    assert got[("container_fs_writes_bytes_total", (dev,))] == 64
    assert got[("container_blkio_device_usage_total", (dev, str(2**20), "0", "Write"))] == 64
    assert ("container_fs_reads_total", (dev,)) not in got
