"""pycri's own Prometheus metrics (`metrics_address`), not the CRI's pod metrics
(those are server/metrics_rpcs.py).

Counters and histograms live here, in one registry, and are fed where every call of
their kind passes (the `rpc` wrapper, `OCIRuntime.run`, `run_plugin`, `PluginLink.call`,
the image pull): one observe per call, no lock held across an await. Pods, containers, conmons and
streaming sessions are counted only when scraped, from the daemon's in-memory records
(pycri/statemetrics.py), so the CRI path does no bookkeeping for them. The endpoint is
pycri/metrics_listener.py, one thread with its own event loop: a scrape never waits on
the daemon's loop, and a flood of connections is bounded there. This module imports
nothing of pycri's: every layer that counts something can import it.

The counters are this module's own, and prometheus_client (with the http.server, email
and urllib it brings, 2.6 MiB of an idle daemon's 55) is imported only when something
reads them: the endpoint's start, or `REGISTRY.get_sample_value`. A node that serves no
metrics never loads it; a scrape sees the same families prometheus_client's own
Counter and Histogram would give.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

# A CRI call spans ~50 µs (a List from memory) to minutes (a pull, a slow stop).
_RPC_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120)
_CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_PULL_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Collector:
    """What the registry collects from: `collect` gives prometheus_client families."""

    def collect(self) -> Iterable[Metric]:
        raise NotImplementedError


class _Registry:
    """The daemon's collectors; prometheus_client's registry is made on first read."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []
        self._prometheus: CollectorRegistry | None = None
        self._lock = threading.Lock()

    def register(self, collector: Collector) -> None:
        self._collectors.append(collector)

    def unregister(self, collector: Collector) -> None:
        self._collectors.remove(collector)

    def prometheus(self) -> CollectorRegistry:
        with self._lock:
            if self._prometheus is None:
                from prometheus_client import CollectorRegistry, ProcessCollector

                reg = CollectorRegistry()
                ProcessCollector(namespace="pycri", registry=reg)
                reg.register(self)  # a collector of the collectors
                self._prometheus = reg
            return self._prometheus

    def collect(self) -> Iterable[Metric]:
        for c in list(self._collectors):
            yield from c.collect()

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None
                         ) -> float | None:  # fmt: skip
        return self.prometheus().get_sample_value(name, labels)


REGISTRY = _Registry()


class _Child:
    """One label set's numbers: a counter's `value`, or a histogram's `counts` per
    bucket (the last one +Inf) and `sum`. Locked: runtime and CNI calls may finish in
    worker threads."""

    __slots__ = ("bounds", "counts", "lock", "sum", "value")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.value = 0.0
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.lock = threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        with self.lock:
            self.value += amount

    def observe(self, seconds: float) -> None:
        with self.lock:
            self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
            self.sum += seconds


class _Latency(_Child):
    """A CRI method's latency, observed without the lock: only the event loop's thread
    observes (one bisect and two adds, ~0.3 µs), and a scrape reading mid-update is off
    by one call at most."""

    __slots__ = ()

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds


class _Metric(Collector):
    """A counter or histogram by label values, kept as plain numbers; its family is
    built only when scraped. Without labels the metric is its own single child."""

    def __init__(self, name: str, doc: str, labels: Iterable[str] = (),
                 buckets: tuple[float, ...] = (), child: type[_Child] = _Child) -> None:
        self.name, self.doc, self.labelnames = name, doc, list(labels)
        self._bounds, self._child = buckets, child
        self._children: dict[tuple[str, ...], _Child] = {}
        self._only = None if self.labelnames else self.labels()
        REGISTRY.register(self)

    def labels(self, *values: str) -> _Child:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: label values {values} for {self.labelnames}")
            child = self._children.setdefault(values, self._child(self._bounds))
        return child

    def inc(self, amount: float = 1.0) -> None:
        assert self._only is not None, f"{self.name} has labels"
        self._only.inc(amount)

    def observe(self, seconds: float) -> None:
        assert self._only is not None, f"{self.name} has labels"
        self._only.observe(seconds)


class Counter(_Metric):
    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import CounterMetricFamily

        # prometheus_client's naming: the family without `_total`, the sample with it
        family = CounterMetricFamily(self.name.removesuffix("_total"), self.doc,
                                     labels=self.labelnames)  # fmt: skip
        for values, child in list(self._children.items()):
            family.add_metric(list(values), child.value)
        yield family


class Histogram(_Metric):
    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        family = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in list(self._children.items()):
            total, buckets = 0, []
            for bound, n in zip((*self._bounds, math.inf), list(child.counts), strict=True):
                total += n
                buckets.append((floatToGoString(bound), total))
            family.add_metric(list(values), buckets, child.sum)
        yield family


RPC_SECONDS = Histogram(
    "pycri_rpc_duration_seconds", "CRI calls by method, failed ones included",
    ["method"], _RPC_BUCKETS, _Latency,
)  # fmt: skip
RPC_ERRORS = Counter(
    "pycri_rpc_errors_total", "CRI calls that failed, by method and gRPC status code",
    ["method", "code"],
)  # fmt: skip
RUNTIME_SECONDS = Histogram(
    "pycri_oci_runtime_duration_seconds", "OCI runtime CLI calls (runc/crun) by handler "
    "and action; `create` is the runtime run by conmon", ["runtime", "action"],
    _CALL_BUCKETS,
)  # fmt: skip
RUNTIME_ERRORS = Counter(
    "pycri_oci_runtime_errors_total", "OCI runtime calls that failed or timed out",
    ["runtime", "action"],
)  # fmt: skip
CNI_SECONDS = Histogram(
    "pycri_cni_plugin_duration_seconds", "CNI plugin calls by plugin type and command",
    ["plugin", "command"], _CALL_BUCKETS,
)  # fmt: skip
CNI_ERRORS = Counter(
    "pycri_cni_plugin_errors_total", "CNI plugin calls that failed or timed out",
    ["plugin", "command"],
)  # fmt: skip
NRI_SECONDS = Histogram(
    "pycri_nri_plugin_duration_seconds", "NRI plugin calls by plugin and method",
    ["plugin", "method"], _CALL_BUCKETS,
)  # fmt: skip
NRI_ERRORS = Counter(
    "pycri_nri_plugin_errors_total", "NRI plugin calls that failed or timed out",
    ["plugin", "method"],
)  # fmt: skip
PULL_SECONDS = Histogram(
    "pycri_image_pull_duration_seconds", "Image pulls, failed ones included",
    buckets=_PULL_BUCKETS,
)  # fmt: skip
PULL_FAILURES = Counter("pycri_image_pull_failures_total", "Image pulls that failed")
PULL_BYTES = Counter("pycri_image_pull_bytes_total", "Blob bytes received from registries")
PULL_PHASE_SECONDS = Histogram(
    "pycri_image_pull_phase_duration_seconds", "Phases of image pulls (resolving the "
    "manifest and config, downloading and unpacking the layers, committing)", ["phase"],
    _PULL_BUCKETS,
)  # fmt: skip
PULL_STALLS = Counter(
    "pycri_image_pull_stalls_total", "Registry fetches that made no progress for "
    "images.pull_progress_timeout (the next endpoint, if any, is tried)")


@contextlib.contextmanager
def timed(seconds: _Child | Histogram, failures: _Child | Counter) -> Iterator[None]:
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
