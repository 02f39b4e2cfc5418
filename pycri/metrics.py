"""pycri's own Prometheus metrics (`metrics_address`), not the CRI's pod metrics
(those are server/metrics_rpcs.py).

Counters and histograms live here, in one registry, and are fed where every call of
their kind passes (the `rpc` wrapper, `OCIRuntime.run`, `run_plugin`, `PluginLink.call`,
the image pull): one observe per call, no lock held across an await. Pods, containers, conmons and
streaming sessions are counted only when scraped, from the daemon's in-memory records
(`StateCollector`), so the CRI path does no bookkeeping for them. The endpoint is
prometheus_client's HTTP server in its own thread: a scrape never waits on the loop.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from pycri.container.manager import ContainerManager
    from pycri.launcher import Launcher
    from pycri.sandbox.manager import SandboxManager
    from pycri.streaming import StreamingServer

disable_created_metrics()  # the *_created series say only when pycri started
REGISTRY = CollectorRegistry()
ProcessCollector(namespace="pycri", registry=REGISTRY)

# A CRI call spans ~50 µs (a List from memory) to minutes (a pull, a slow stop).
_RPC_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120)
_CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_PULL_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

RPC_ERRORS = Counter(
    "pycri_rpc_errors_total", "CRI calls that failed, by method and gRPC status code",
    ["method", "code"], registry=REGISTRY,
)  # fmt: skip
RUNTIME_SECONDS = Histogram(
    "pycri_oci_runtime_duration_seconds", "OCI runtime CLI calls (runc/crun) by handler "
    "and action; `create` is the runtime run by conmon", ["runtime", "action"],
    buckets=_CALL_BUCKETS, registry=REGISTRY,
)  # fmt: skip
RUNTIME_ERRORS = Counter(
    "pycri_oci_runtime_errors_total", "OCI runtime calls that failed or timed out",
    ["runtime", "action"], registry=REGISTRY,
)  # fmt: skip
CNI_SECONDS = Histogram(
    "pycri_cni_plugin_duration_seconds", "CNI plugin calls by plugin type and command",
    ["plugin", "command"], buckets=_CALL_BUCKETS, registry=REGISTRY,
)  # fmt: skip
CNI_ERRORS = Counter(
    "pycri_cni_plugin_errors_total", "CNI plugin calls that failed or timed out",
    ["plugin", "command"], registry=REGISTRY,
)  # fmt: skip
NRI_SECONDS = Histogram(
    "pycri_nri_plugin_duration_seconds", "NRI plugin calls by plugin and method",
    ["plugin", "method"], buckets=_CALL_BUCKETS, registry=REGISTRY,
)  # fmt: skip
NRI_ERRORS = Counter(
    "pycri_nri_plugin_errors_total", "NRI plugin calls that failed or timed out",
    ["plugin", "method"], registry=REGISTRY,
)  # fmt: skip
PULL_SECONDS = Histogram(
    "pycri_image_pull_duration_seconds", "Image pulls, failed ones included",
    buckets=_PULL_BUCKETS, registry=REGISTRY,
)  # fmt: skip
PULL_FAILURES = Counter(
    "pycri_image_pull_failures_total", "Image pulls that failed", registry=REGISTRY,
)  # fmt: skip
PULL_BYTES = Counter(
    "pycri_image_pull_bytes_total", "Blob bytes received from registries",
    registry=REGISTRY,
)  # fmt: skip


class _Latency:
    """One method's latency buckets, counted without a lock: only the event loop's
    thread observes (one bisect and two adds, ~0.3 µs against prometheus_client's
    locked Histogram.observe at ~2 µs), and a scrape reading mid-update is off by
    one call at most."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(_RPC_BUCKETS) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(_RPC_BUCKETS, seconds)] += 1
        self.sum += seconds


class _RPCLatency(Collector):
    """pycri_rpc_duration_seconds, a histogram by method, from the `_Latency`s."""

    def __init__(self) -> None:
        self._methods: dict[str, _Latency] = {}

    def labels(self, method: str) -> _Latency:
        return self._methods.setdefault(method, _Latency())

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily("pycri_rpc_duration_seconds",
                                       "CRI calls by method, failed ones included",
                                       labels=["method"])  # fmt: skip
        for method, lat in list(self._methods.items()):
            total, buckets = 0, []
            for bound, n in zip((*_RPC_BUCKETS, math.inf), list(lat.counts), strict=True):
                total += n
                buckets.append((floatToGoString(bound), total))
            family.add_metric([method], buckets, lat.sum)
        yield family


RPC_SECONDS = _RPCLatency()
REGISTRY.register(RPC_SECONDS)


@contextlib.contextmanager
def timed(seconds: Histogram, failures: Counter) -> Iterator[None]:
    """Observe the block's duration in `seconds`; count it in `failures` if it raises
    (cancellation included: a killed call did not succeed)."""
    t0 = time.perf_counter()
    try:
        yield
    except BaseException:
        failures.inc()
        raise
    finally:
        seconds.observe(time.perf_counter() - t0)


class StateCollector(Collector):
    """Gauges computed at scrape time from the daemon's records (read in the scrape
    thread: `list()` of a dict is one atomic step under the GIL)."""

    def __init__(self, sandboxes: SandboxManager, containers: ContainerManager,
                 launcher: Launcher, streaming: StreamingServer) -> None:  # fmt: skip
        self.sandboxes = sandboxes
        self.containers = containers
        self.launcher = launcher
        self.streaming = streaming

    def collect(self) -> Iterable[Metric]:
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


def serve(address: str) -> Callable[[], None]:
    """Serve /metrics on `address` (host:port) from a thread; returns the stopper.
    Raises OSError when the address cannot be bound."""
    host, _, port = address.rpartition(":")
    server, thread = start_http_server(int(port), addr=host.strip("[]"), registry=REGISTRY)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop
