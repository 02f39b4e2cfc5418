"""The cgroup reader: where a cgroup lies on v1, v2 and hybrid hosts, the kernel files'
formats, and each fact's v1 and v2 file, on directories laid out like a cgroup root
and on this host's real cgroups."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pycri import cgroups
from pycri.cgroups import Cgroup, IoEntry, PsiLine, parse_pressure, relative_dir
from tests.lib import cgrouptree
from tests.lib.cgrouptree import write


def test_systemd_and_cgroupfs_paths() -> None:
    assert relative_dir("system.slice:pycri:abc") == "system.slice/pycri-abc.scope"
    assert relative_dir("a-b.slice:pycri:abc") == "a.slice/a-b.slice/pycri-abc.scope"
    assert relative_dir("-.slice:pycri:abc") == "pycri-abc.scope"
    assert relative_dir("/pycri/pycri-abc") == "pycri/pycri-abc"
    assert relative_dir("/a:b/pycri-abc") == "a:b/pycri-abc"  # a cgroupfs path with ':'


def test_parse_pressure() -> None:
    psi = ("some avg10=12.50 avg60=3.25 avg300=0.75 total=4000000\n"
           "full avg10=1.00 avg60=0.50 avg300=0.25 total=1000000\n")
    assert parse_pressure(psi) == {"some": PsiLine(4000000, 12.5, 3.25, 0.75),
                                   "full": PsiLine(1000000, 1.0, 0.5, 0.25)}
    # an old kernel's cpu.pressure has no "full" line; a line without total is dropped
    assert parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\nfull avg10=x\n") == {
        "some": PsiLine(7, 0, 0, 0)}
    assert parse_pressure("") == {}


def test_parse_keyed() -> None:
    assert cgroups.parse_keyed("nr_periods 12\nnr_throttled 3\nbad x\n") == {
        "nr_periods": 12, "nr_throttled": 3}
    assert cgroups.parse_keyed("") == {}


def test_single_value_files(tmp_path: Path) -> None:
    """One reader per kind of single-value file: a counter is 0 when absent or "max",
    a limit None for "max", v1's page-rounded LONG_MAX or absent, an optional value
    None only when absent (0 is a real value)."""
    write(tmp_path, {"n": "4096\n", "max": "max\n", "zero": "0\n", "neg": "-1\n",
                     "huge": "9223372036854771712\n", "procs": "7\n8\n"})
    f = {name: str(tmp_path / name) for name in ("n", "max", "zero", "neg", "huge", "gone")}
    assert [cgroups.read_count(p) for p in f.values()] == [4096, 0, 0, 0, 9223372036854771712, 0]
    assert [cgroups.read_limit(p) for p in f.values()] == [4096, None, 0, None, None, None]
    assert [cgroups.read_optional(p) for p in f.values()] == [4096, None, 0, -1,
                                                              9223372036854771712, None]
    assert cgroups.read_pids(str(tmp_path / "procs")) == [7, 8]
    assert cgroups.read_pids(f["gone"]) == []
    assert cgroups.read_text(f["gone"]) == ""


def test_parse_blkio_v1() -> None:
    text = "8:0 Read 4096\n8:0 Write 8192\n8:0 Total 12288\nTotal 12288\n"
    assert cgroups.parse_blkio_v1(text) == [
        IoEntry(8, 0, "Read", 4096), IoEntry(8, 0, "Write", 8192), IoEntry(8, 0, "Total", 12288)]
    assert cgroups.parse_blkio_v1("Total 0\n") == []


def test_parse_io_stat_v2() -> None:
    nbytes, ops = cgroups.parse_io_stat(
        "254:0 rbytes=100 wbytes=200 rios=1 wios=2 dbytes=0 dios=0\n")
    assert nbytes == [IoEntry(254, 0, "Read", 100), IoEntry(254, 0, "Write", 200),
                      IoEntry(254, 0, "Discard", 0)]
    assert ops == [IoEntry(254, 0, "Read", 1), IoEntry(254, 0, "Write", 2),
                   IoEntry(254, 0, "Discard", 0)]


def test_hybrid_v1_facts(tmp_path: Path) -> None:
    c = "pycri/pycri-abc"
    hz = os.sysconf("SC_CLK_TCK")
    write(tmp_path, {
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
    r = Cgroup.of("/pycri/pycri-abc", tmp_path)
    assert (r.cpu_ns, r.cpu_user_ns, r.cpu_system_ns) == (3500000000, 2 * 10**9, 10**9)
    assert (r.cpu_periods, r.cpu_throttled_periods, r.cpu_throttled_ns) == (50, 20, 2500000000)
    assert (r.memory_usage, r.memory_peak, r.working_set) == (1000000, 2000000, 900000)
    assert (r.cache, r.rss, r.mapped_file, r.swap, r.kernel) == (400, 500, 60, 7, 30000)
    assert (r.failcnt, r.oom_kills) == (4, 2)
    assert r.faults == {("pgfault", "container"): 10, ("pgfault", "hierarchy"): 11,
                        ("pgmajfault", "container"): 1, ("pgmajfault", "hierarchy"): 2}
    assert r.hugetlb == {"2MB": (2097152, 4194304)}
    assert r.io == ([IoEntry(8, 0, "Read", 4096)], [IoEntry(8, 0, "Read", 1)])
    assert (r.procs, r.threads, r.threads_max) == ([100, 101], 3, 0)
    # A hybrid host keeps pressure on its v2 mount, at the same path.
    assert r.pressure == {"memory": {"some": PsiLine(2000000, 1.5, 0, 0)}}


def test_v2_facts(tmp_path: Path) -> None:
    c = "pycri.slice/pycri-abc.scope"
    write(tmp_path, {
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
    r = Cgroup.of("pycri.slice:pycri:abc", tmp_path)
    assert (r.cpu_ns, r.cpu_user_ns, r.cpu_system_ns) == (3 * 10**9, 2 * 10**9, 10**9)
    assert (r.cpu_periods, r.cpu_throttled_periods, r.cpu_throttled_ns) == (9, 4, 1500000000)
    assert (r.memory_usage, r.memory_peak, r.working_set, r.swap) == (5000, 9000, 4000, 12)
    assert (r.cache, r.rss, r.mapped_file, r.kernel) == (200, 100, 40, 300)
    assert (r.failcnt, r.oom_kills) == (3, 1)
    assert r.faults[("pgfault", "hierarchy")] == r.faults[("pgfault", "container")] == 77
    assert r.hugetlb == {"2MB": (0, None)}
    assert r.pressure == {"cpu": {"some": PsiLine(3000000, 0, 0, 0),
                                  "full": PsiLine(1000000, 0, 0, 0)}}
    assert [e.op for e in r.io[0]] == ["Read", "Write", "Discard"]
    assert (r.procs, r.threads, r.threads_max) == ([7], 2, 512)


def test_modes_and_directories(tmp_path: Path) -> None:
    """v1: a hierarchy per controller (a co-mounted one's symlinks not twice); hybrid:
    plus a v2 mount named unified, where PSI lives; v2: one hierarchy."""
    v1 = tmp_path / "v1"
    for h in ("cpu,cpuacct", "memory", "pids"):
        (v1 / h).mkdir(parents=True)
    (v1 / "cpu").symlink_to("cpu,cpuacct")
    assert (cgroups.mode(v1), cgroups.v2_controllers(v1)) == ("v1", [])
    cg = Cgroup("pycri/c1", v1)
    assert sorted(d.relative_to(v1).as_posix() for d in cg.dirs()) == [
        "cpu,cpuacct/pycri/c1", "memory/pycri/c1", "pids/pycri/c1"]
    assert cg.dir("memory") == f"{v1}/memory/pycri/c1"
    assert cg.unified == f"{v1}/unified/pycri/c1"  # none here: no PSI is read
    assert cg.pressure == {}
    write(v1, {"unified/cgroup.controllers": "hugetlb\n"})
    assert (cgroups.mode(v1), cgroups.v2_controllers(v1)) == ("hybrid", ["hugetlb"])
    v2 = tmp_path / "v2"
    write(v2, {"cgroup.controllers": "cpu memory\n"})
    assert (cgroups.mode(v2), cgroups.v2_controllers(v2)) == ("v2", ["cpu", "memory"])
    cg = Cgroup.of("pycri.slice:pycri:c1", v2)
    assert [str(d) for d in cg.dirs()] == [cg.dir("memory")] == [cg.unified] == [
        f"{v2}/pycri.slice/pycri-c1.scope"]


def test_gone_cgroup_reads_as_zeros(tmp_path: Path) -> None:
    for root in (tmp_path, tmp_path / "v2"):
        write(root, {"cgroup.controllers": ""} if root.name == "v2" else {})
        cg = Cgroup("pycri/gone", root)
        assert (cg.cpu_ns, cg.cpu_user_ns, cg.memory_usage, cg.working_set, cg.kernel,
                cg.failcnt, cg.oom_kills, cg.processes, cg.threads, cg.threads_max) == (
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        assert (cg.memory_limit, cg.swap, cg.swap_limit) == (None, None, None)
        assert (cg.procs, cg.hugetlb, cg.io, cg.pressure) == ([], {}, ([], []), {})


def test_v2_kernel_memory_from_its_parts(tmp_path: Path) -> None:
    """Kernels before 5.18 have no `kernel` line in memory.stat: its stack plus slab."""
    write(tmp_path, {"cgroup.controllers": "memory\n",
                     "c/memory.stat": "kernel_stack 16384\nslab 1000\n"})
    assert Cgroup("c", tmp_path).kernel == 17384


def test_each_file_read_once_per_sample(tmp_path: Path) -> None:
    """Facts sharing a file read it once; a new Cgroup is a new sample."""
    write(tmp_path, {"cgroup.controllers": "memory\n", "c/memory.current": "100\n",
                     "c/memory.stat": "inactive_file 10\nanon 5\n"})
    cg = Cgroup("c", tmp_path)
    assert (cg.working_set, cg.rss) == (90, 5)
    write(tmp_path, {"c/memory.current": "200\n", "c/memory.stat": "inactive_file 0\n"})
    assert (cg.memory_usage, cg.working_set, cg.rss) == (100, 90, 5)
    assert Cgroup("c", tmp_path).working_set == 200


@pytest.mark.skipif(os.geteuid() != 0, reason="makes cgroups on this host")
def test_real_cgroup_of_this_host() -> None:
    """A cgroup made in every hierarchy the reader looks at (this host: hybrid), with a
    spinning shell charged to it: each fact read from the kernel's own files."""
    real = cgrouptree.Cgroup(f"pycri-test-{os.getpid()}")
    real.make(64 << 20)
    try:
        pid = real.spin()
        deadline = time.monotonic() + 10
        while Cgroup(real.rel).cpu_ns < 10**7:  # the shell has run 10 ms
            assert time.monotonic() < deadline, "the shell got no CPU time"
            time.sleep(0.01)
        cg = Cgroup.of(f"/{real.rel}")
        hybrid = (cgrouptree.ROOT / "unified" / "cgroup.controllers").exists()
        assert cgroups.mode() == ("v2" if cgrouptree.PURE_V2 else "hybrid" if hybrid else "v1")
        assert cg.v2 == cgrouptree.PURE_V2
        assert cg.memory_usage > 0 and 0 < cg.working_set <= cg.memory_usage
        assert cg.memory_limit == 64 << 20
        assert cg.cpu_user_ns + cg.cpu_system_ns <= cg.cpu_ns + 10**8  # ticks round
        assert (cg.procs, cg.processes, cg.threads) == ([pid], 1, 1)
        assert set(real.dirs) <= set(cg.dirs())
        if cg.v2 or hybrid:
            assert set(cg.pressure) == {"cpu", "memory", "io"}
            assert cg.pressure["cpu"]["some"].total_us >= 0
    finally:
        real.remove()
