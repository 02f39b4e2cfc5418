"""CRI metrics end to end: descriptors and pod metrics checked the way critest does,
and values read from a real container's cgroup, /proc and its pod's network."""

from __future__ import annotations

import time

import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e

# critest's expected names minus those it accepts as unimplemented (pkg/validate/pod.go).
REQUIRED = {
    "container_blkio_device_usage_total", "container_cpu_cfs_periods_total",
    "container_cpu_cfs_throttled_periods_total", "container_cpu_cfs_throttled_seconds_total",
    "container_cpu_system_seconds_total", "container_cpu_usage_seconds_total",
    "container_cpu_user_seconds_total", "container_file_descriptors",
    "container_fs_inodes_free", "container_fs_inodes_total", "container_fs_limit_bytes",
    "container_fs_reads_bytes_total", "container_fs_reads_total", "container_fs_usage_bytes",
    "container_fs_writes_bytes_total", "container_fs_writes_total", "container_last_seen",
    "container_memory_cache", "container_memory_failcnt", "container_memory_failures_total",
    "container_memory_kernel_usage", "container_memory_mapped_file",
    "container_memory_max_usage_bytes", "container_memory_rss", "container_memory_swap",
    "container_memory_usage_bytes", "container_memory_working_set_bytes",
    "container_network_receive_bytes_total", "container_network_receive_errors_total",
    "container_network_receive_packets_dropped_total", "container_network_receive_packets_total",
    "container_network_transmit_bytes_total", "container_network_transmit_errors_total",
    "container_network_transmit_packets_dropped_total",
    "container_network_transmit_packets_total", "container_oom_events_total",
    "container_processes", "container_sockets", "container_spec_cpu_period",
    "container_spec_cpu_shares", "container_spec_memory_limit_bytes",
    "container_spec_memory_swap_limit_bytes", "container_start_time_seconds",
    "container_threads", "container_threads_max",
}
# Block I/O accounting depends on the disk under the test; critest makes them optional too.
OPTIONAL_VALUES = {
    "container_blkio_device_usage_total", "container_fs_reads_bytes_total",
    "container_fs_reads_total", "container_fs_writes_bytes_total", "container_fs_writes_total",
}
MiB = 1024 * 1024


def values(metrics: list[pb.Metric], name: str) -> list[pb.Metric]:
    return [m for m in metrics if m.name == name]


def one(metrics: list[pb.Metric], name: str) -> int:
    found = values(metrics, name)
    assert len(found) == 1, (name, found)
    return found[0].value.value


def pod_entry(node: Node, sid: str) -> pb.PodSandboxMetrics:
    resp = node.cri.runtime.ListPodSandboxMetrics(pb.ListPodSandboxMetricsRequest())
    return next(p for p in resp.pod_metrics if p.pod_sandbox_id == sid)


def test_descriptors(node: Node) -> None:
    descs = node.cri.runtime.ListMetricDescriptors(pb.ListMetricDescriptorsRequest()).descriptors
    names = [d.name for d in descs]
    assert len(names) == len(set(names))
    assert set(names) >= REQUIRED, REQUIRED - set(names)
    for d in descs:
        assert d.help and d.label_keys, d.name
        assert list(d.label_keys[:5]) == ["pod", "namespace", "container", "id", "image"]


def test_pod_metrics(node: Node) -> None:
    sid, pod = node.run_pod("metrics")
    limits = pb.LinuxContainerResources(cpu_period=100000, cpu_quota=50000, cpu_shares=512,
                                        memory_limit_in_bytes=64 * MiB,
                                        memory_swap_limit_in_bytes=64 * MiB)
    before = time.time()
    busy = node.run(sid, pod, "busy", ["sh", "-c", "while true; do :; done"],
                    linux=pb.LinuxContainerConfig(resources=limits))
    idle = node.run(sid, pod, "idle", ["sleep", "1000"])
    gone = node.run(sid, pod, "gone", ["true"])
    deadline = time.monotonic() + 10
    while node.status(gone).state != pb.CONTAINER_EXITED:
        assert time.monotonic() < deadline, "`true` did not exit"
        time.sleep(0.05)
    gateway = node.subnet.rsplit(".", 1)[0] + ".1"
    assert node.exec(idle, "ping", "-c", "1", "-W", "2", gateway).exit_code == 0
    assert node.exec(idle, "dd", "if=/dev/zero", "of=/big", "bs=1M", "count=2").exit_code == 0

    deadline = time.monotonic() + 15
    while True:  # the busy loop gets 0.5 CPU: one whole CPU second takes about 2 s
        entry = pod_entry(node, sid)
        by_id = {c.container_id: list(c.metrics) for c in entry.container_metrics}
        b = by_id[busy]
        # Values are whole seconds: user and system, truncated apart, lag the total.
        if one(b, "container_cpu_usage_seconds_total") >= 1 and one(
            b, "container_cpu_user_seconds_total"
        ) + one(b, "container_cpu_system_seconds_total") >= 1:
            break
        assert time.monotonic() < deadline, "no CPU second accounted to the busy container"
        time.sleep(0.25)

    # What critest checks: every required name has values; label counts match descriptors.
    descs = {d.name: d for d in node.cri.runtime.ListMetricDescriptors(
        pb.ListMetricDescriptorsRequest()).descriptors}
    everything = list(entry.metrics) + [m for c in entry.container_metrics for m in c.metrics]
    seen = {m.name for m in everything}
    assert seen >= REQUIRED - OPTIONAL_VALUES, REQUIRED - OPTIONAL_VALUES - seen
    for m in everything:
        assert len(m.label_values) == len(descs[m.name].label_keys), m
        assert m.timestamp > 0

    assert set(by_id) == {busy, idle}  # the exited container is not sampled
    b, i = by_id[busy], by_id[idle]
    usage = values(b, "container_cpu_usage_seconds_total")[0]
    assert list(usage.label_values) == ["metrics", "e2e", "busy", busy, node.image]
    assert usage.metric_type == pb.COUNTER
    assert values(b, "container_memory_usage_bytes")[0].metric_type == pb.GAUGE
    assert one(b, "container_cpu_cfs_periods_total") > 0
    assert one(b, "container_cpu_cfs_throttled_periods_total") > 0  # quota of half a CPU
    assert one(b, "container_cpu_user_seconds_total") + one(
        b, "container_cpu_system_seconds_total") >= 1
    assert one(b, "container_memory_usage_bytes") > 0
    # PSI is on the v2 mount of this hybrid host: found there for v1 containers too.
    for res in ("cpu", "memory", "io"):
        assert values(b, f"container_pressure_{res}_waiting_seconds_total"), res
    assert one(b, "container_memory_working_set_bytes") > 0
    assert one(b, "container_processes") == 1
    assert one(b, "container_threads") == 1
    assert one(b, "container_file_descriptors") >= 3  # stdio
    assert one(b, "container_sockets") == 0
    assert one(b, "container_spec_cpu_period") == 100000
    assert one(b, "container_spec_cpu_quota") == 50000
    assert one(b, "container_spec_cpu_shares") == 512
    assert one(b, "container_spec_memory_limit_bytes") == 64 * MiB
    assert one(b, "container_spec_memory_swap_limit_bytes") == 64 * MiB
    assert int(before) <= one(b, "container_start_time_seconds") <= time.time()
    assert one(b, "container_last_seen") >= one(b, "container_start_time_seconds")
    faults = {tuple(m.label_values[5:]): m.value.value
              for m in values(b, "container_memory_failures_total")}
    assert faults[("pgfault", "container")] > 0
    assert one(i, "container_fs_usage_bytes") >= 2 * MiB
    assert one(i, "container_fs_limit_bytes") > one(i, "container_fs_usage_bytes")
    assert 0 < one(i, "container_fs_inodes_free") < one(i, "container_fs_inodes_total")
    assert one(i, "container_cpu_usage_seconds_total") == 0
    assert "container_spec_cpu_quota" not in {m.name for m in i}  # no quota set

    eth0 = [m for m in entry.metrics if m.label_values[-1] == "eth0"]
    assert {m.name for m in eth0} == {n for n in REQUIRED if "_network_" in n}
    assert all(list(m.label_values) == ["metrics", "e2e", "", sid, "", "eth0"] for m in eth0)
    assert one(eth0, "container_network_transmit_bytes_total") > 0
    assert one(eth0, "container_network_transmit_packets_total") >= 1
    assert one(eth0, "container_network_receive_packets_total") >= 1

    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    resp = node.cri.runtime.ListPodSandboxMetrics(pb.ListPodSandboxMetricsRequest())
    assert [p.pod_sandbox_id for p in resp.pod_metrics] == []  # only ready pods
