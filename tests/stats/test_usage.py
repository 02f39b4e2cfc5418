"""A stats sample of a container's cgroup, from the cgroupsPath pycri gave the runtime:
counters, limits, swap and pressure (absent when not there), and the CRI messages the
servicer makes of it."""

from __future__ import annotations

from pathlib import Path

from pycri.api import api_pb2 as pb
from pycri.cgroups import PsiLine
from pycri.server import stats_rpcs
from pycri.stats.usage import Usage, add, read_pod, read_usage
from tests.lib.cgrouptree import write


def test_cgroupfs_parent_with_a_colon(tmp_path: Path) -> None:
    """Found by the fuzzer: a pod whose cgroup_parent held ':' made every stats RPC
    (ListPodSandboxStats, ListContainerStats, ListPodSandboxMetrics) INTERNAL."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert read_usage("/a:b/pycri-abc", root=tmp_path) == Usage()


PSI = ("some avg10=12.50 avg60=3.25 avg300=0.75 total=4000000\n"
       "full avg10=1.00 avg60=0.50 avg300=0.25 total=1000000\n")
SOME = PsiLine(4000000, 12.5, 3.25, 0.75)
FULL = PsiLine(1000000, 1.0, 0.5, 0.25)
MiB = 1 << 20


def test_hybrid_v1_with_pressure_swap_and_limits(tmp_path: Path) -> None:
    c = "pycri/pycri-abc"
    write(tmp_path, {
        f"memory/{c}/memory.usage_in_bytes": f"{10 * MiB}\n",
        f"memory/{c}/memory.stat": f"total_inactive_file {2 * MiB}\ntotal_swap 4096\n",
        f"memory/{c}/memory.limit_in_bytes": f"{64 * MiB}\n",
        f"memory/{c}/memory.memsw.limit_in_bytes": f"{96 * MiB}\n",
        **{f"unified/{c}/{res}.pressure": PSI for res in ("cpu", "memory", "io")},
    })
    u = read_usage("/pycri/pycri-abc", tmp_path)
    assert u.working_set_bytes == 8 * MiB
    assert (u.memory_limit, u.available_bytes) == (64 * MiB, 56 * MiB)
    assert (u.swap_bytes, u.swap_limit, u.swap_available_bytes) == (4096, 32 * MiB,
                                                                   32 * MiB - 4096)
    assert u.pressure == {res: {"some": SOME, "full": FULL} for res in ("cpu", "memory", "io")}


def test_v2_with_pressure_swap_and_limits(tmp_path: Path) -> None:
    c = "pycri.slice/pycri-abc.scope"
    write(tmp_path, {
        "cgroup.controllers": "cpu memory io pids\n",
        f"{c}/memory.current": f"{10 * MiB}\n",
        f"{c}/memory.stat": f"inactive_file {MiB}\n",
        f"{c}/memory.max": f"{32 * MiB}\n",
        f"{c}/memory.swap.current": "0\n",
        f"{c}/memory.swap.max": f"{16 * MiB}\n",
        f"{c}/cpu.pressure": PSI,
    })
    u = read_usage("pycri.slice:pycri:abc", tmp_path)
    assert (u.memory_limit, u.available_bytes) == (32 * MiB, 23 * MiB)
    assert (u.swap_bytes, u.swap_available_bytes) == (0, 16 * MiB)  # 0 is a real value here
    assert u.pressure == {"cpu": {"some": SOME, "full": FULL}}


def test_unlimited_is_absent_not_zero(tmp_path: Path) -> None:
    """No limit (v2 "max", v1's page-rounded LONG_MAX): no available bytes at all."""
    c = "pycri/pycri-abc"
    write(tmp_path, {
        f"memory/{c}/memory.usage_in_bytes": "100\n",
        f"memory/{c}/memory.stat": "total_swap 0\n",
        f"memory/{c}/memory.limit_in_bytes": "9223372036854771712\n",
        f"memory/{c}/memory.memsw.limit_in_bytes": "9223372036854771712\n",
    })
    u = read_usage(f"/{c}", tmp_path)
    assert (u.memory_limit, u.available_bytes, u.swap_limit) == (None, None, None)
    assert (u.swap_bytes, u.swap_available_bytes) == (0, None)
    v2 = tmp_path / "v2"
    write(v2, {"cgroup.controllers": "memory\n", f"{c}/memory.max": "max\n",
               f"{c}/memory.swap.current": "5\n", f"{c}/memory.swap.max": "max\n"})
    u = read_usage(f"/{c}", v2)
    assert (u.available_bytes, u.swap_bytes, u.swap_available_bytes) == (None, 5, None)


def test_missing_files_are_absent_not_zero(tmp_path: Path) -> None:
    """A cgroup root without pressure, swap or limit files (pure v1 without a v2 mount,
    swap accounting off, a kernel without PSI)."""
    c = "pycri/pycri-abc"
    write(tmp_path, {f"memory/{c}/memory.usage_in_bytes": "100\n",
                     f"memory/{c}/memory.stat": "total_rss 10\n"})
    u = read_usage(f"/{c}", tmp_path)
    assert (u.memory_bytes, u.rss_bytes) == (100, 10)
    assert (u.memory_limit, u.available_bytes, u.swap_bytes, u.swap_available_bytes) == (
        None, None, None, None)
    assert u.pressure == {}
    v2 = tmp_path / "v2"
    write(v2, {"cgroup.controllers": "", f"{c}/memory.current": "100\n"})
    u = read_usage(f"/{c}", v2)
    assert (u.available_bytes, u.swap_bytes, u.pressure) == (None, None, {})
    # what the servicer makes of it: the messages are not there at all
    assert not stats_rpcs._memory(1, u).HasField("available_bytes")
    assert not stats_rpcs._memory(1, u).HasField("psi")
    assert not stats_rpcs._cpu(1, u, 0).HasField("psi")
    assert stats_rpcs._swap(1, u) is None and stats_rpcs._io(1, u) is None


def test_cri_messages_of_a_sample() -> None:
    u = Usage(working_set_bytes=10, memory_limit=25, swap_bytes=0, swap_limit=8,
              pressure={"cpu": {"some": SOME, "full": FULL}, "io": {"some": SOME}})
    cpu = stats_rpcs._cpu(1, u, 0)
    assert cpu.psi.Some == pb.PsiData(Total=4000000 * 1000, Avg10=12.5, Avg60=3.25,
                                      Avg300=0.75)  # CRI totals are nanoseconds
    assert cpu.psi.Full.Total == 10**9
    mem = stats_rpcs._memory(1, u)
    assert mem.available_bytes.value == 15 and not mem.HasField("psi")
    swap = stats_rpcs._swap(1, u)
    assert swap is not None and swap.HasField("swap_usage_bytes")
    assert (swap.swap_usage_bytes.value, swap.swap_available_bytes.value) == (0, 8)
    io = stats_rpcs._io(1, u)
    assert io is not None and io.psi.HasField("Some") and not io.psi.HasField("Full")


def test_pod_cgroup_limit_and_pressure(tmp_path: Path) -> None:
    write(tmp_path, {"memory/kubepods/pod1/memory.limit_in_bytes": f"{MiB}\n",
                     "unified/kubepods/pod1/io.pressure": PSI})
    assert read_pod("kubepods/pod1", tmp_path) == (MiB, {"io": {"some": SOME, "full": FULL}})
    assert read_pod("kubepods/gone", tmp_path) == (None, {})


def test_pod_counters_sum_but_limits_do_not() -> None:
    a = Usage(cpu_ns=1, working_set_bytes=2, memory_limit=10, swap_bytes=1,
              pressure={"cpu": {"some": SOME}})
    assert add(a, a) == Usage(cpu_ns=2, working_set_bytes=4)
