"""The daemon's state as gauges: pods and containers by state, conmons watched, streaming
sessions open, computed at scrape time from the managers' in-memory records, so the CRI
path does no bookkeeping for them (pycri/metrics.py holds the counters the CRI path
feeds)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pycri.metrics import Collector

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from pycri.container.manager import ContainerManager
    from pycri.launcher import Launcher
    from pycri.sandbox.manager import SandboxManager
    from pycri.store import Store
    from pycri.streaming import StreamingServer


class StateCollector(Collector):
    """Gauges computed at scrape time from the daemon's records (read in the scrape
    thread: `list()` of a dict is one atomic step under the GIL)."""

    def __init__(self, sandboxes: SandboxManager, containers: ContainerManager,
                 launcher: Launcher, streaming: StreamingServer, store: Store) -> None:  # fmt: skip
        self.store = store
        self.sandboxes = sandboxes
        self.containers = containers
        self.launcher = launcher
        self.streaming = streaming

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        from pycri.api import api_pb2 as pb

        pods = GaugeMetricFamily("pycri_pods", "Pod sandboxes by state", labels=["state"])
        for state, n in _count(pb.PodSandboxState, (
                s.state for s in list(self.sandboxes.sandboxes.values()))):
            pods.add_metric([state], n)
        yield pods
        ctrs = GaugeMetricFamily("pycri_containers", "Containers by state", labels=["state"])
        for state, n in _count(pb.ContainerState, (
                c.state for c in list(self.containers.containers.values()))):
            ctrs.add_metric([state], n)
        yield ctrs
        yield GaugeMetricFamily("pycri_conmon_processes", "conmon monitors being watched",
                                value=self.launcher.monitors_running())
        aside = GaugeMetricFamily(
            "pycri_records_set_aside", "Stored records pycri could not use, kept for a "
            "person to read: database rows by kind, and pods' CNI caches", labels=["kind"])
        for kind, n in sorted(self.store.set_aside_counts().items()):
            aside.add_metric([kind], n)
        aside.add_metric(["cni-cache"], self.sandboxes.cni.cache.set_aside_count())
        yield aside
        yield GaugeMetricFamily("pycri_streaming_sessions",
                                "Upgraded exec/attach/port-forward sessions open",
                                value=self.streaming.active_sessions())


def _count(enum: object, states: Iterable[int]) -> list[tuple[str, int]]:
    """Every state of the CRI enum (zero included, so a series never vanishes), by its
    lowercase name without the prefix: SANDBOX_NOTREADY -> notready."""
    values = enum.values()  # type: ignore[attr-defined]
    counts = dict.fromkeys(values, 0)
    for s in states:
        counts[s] = counts.get(s, 0) + 1
    return [(enum.Name(v).split("_", 1)[1].lower(), n)  # type: ignore[attr-defined]
            for v, n in counts.items()]
