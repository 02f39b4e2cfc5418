"""The cAdvisor-named metrics: descriptors, the /proc and mountinfo parsers, and the
samples emitted from a cgroup laid out in a directory (its reading: tests/test_cgroups.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from pycri.cgroups import Cgroup
from pycri.stats import metrics, netdev
from tests.lib.cgrouptree import write

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


def test_parse_soft_nofile() -> None:
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


def test_emitted_samples_from_a_cgroup(tmp_path: Path) -> None:
    c = "pycri/pycri-abc"
    write(tmp_path, {
        "cgroup.controllers": "cpu memory io hugetlb pids\n",
        f"{c}/cpu.stat": "usage_usec 2900000\n",
        f"{c}/io.pressure": "some avg10=1.00 avg60=2.00 avg300=3.00 total=4200000\n",
        f"{c}/hugetlb.2MB.current": "5\n",
        f"{c}/io.stat": f"{2**20}:0 wbytes=64\n",
    })
    cg = Cgroup(c, tmp_path)
    emit = metrics._Emitter(("p", "ns", "c", "id", "img"), 1)
    metrics._emit_cpu_memory(emit, cg)
    metrics._emit_io(emit, cg)
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
    assert got[("container_memory_swap", ())] == 0  # no swap accounting: 0, as cAdvisor
