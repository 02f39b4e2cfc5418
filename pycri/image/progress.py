"""What every pull in flight is doing, for an operator (`pycri pulls`, `pycri pull`, a log
line every LOG_EVERY seconds) and for /metrics (phase durations; issue 42).

A pull moves through PHASES; each of its layers counts the bytes fetched from the
registry and the bytes its unpack has consumed, with a rate over the last few seconds
and an ETA from it. A layer two pulls share (one download, `ImagePull._shared`) is one
`LayerProgress` both pulls show. Only the event loop writes these, and a reader gets
copies (`snapshot`), so nothing here needs a lock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pycri import metrics

PHASES = ("resolving", "downloading", "committing")  # "unpacking" is shown, not timed
RATE_WINDOW = 5.0  # seconds of samples a rate is taken over
LOG_EVERY = 10.0  # seconds between two progress lines of one long pull


@dataclass
class LayerProgress:
    """One layer's download (and unpack, streamed from it)."""

    digest: str
    size: int
    fetched: int = 0
    endpoint: str = ""
    done: bool = False
    # How many of the compressed bytes the unpack has read (the pipe's count, read
    # where it is kept: the unpack's thread moves it while no byte arrives).
    read: Callable[[], int] = field(default=lambda: 0, repr=False)
    _samples: deque[tuple[float, int]] = field(default_factory=deque, repr=False)

    def fetch(self, n: int, now: float) -> None:
        self.fetched += n
        self._samples.append((now, self.fetched))
        while len(self._samples) > 2 and now - self._samples[0][0] > RATE_WINDOW:
            self._samples.popleft()

    def restart(self, endpoint: str) -> None:
        """Another try, from `endpoint`: the count starts again from nothing."""
        self.fetched = 0
        self.read = lambda: 0
        self.endpoint = endpoint
        self._samples.clear()

    def rate(self, now: float) -> float:
        """Bytes per second over the last RATE_WINDOW seconds (0 when stalled)."""
        if len(self._samples) < 2 or now - self._samples[-1][0] > RATE_WINDOW:
            return 0.0
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def eta(self, now: float) -> float | None:
        """Seconds left at the current rate; None if unknown (no rate)."""
        if self.done:
            return 0.0
        r = self.rate(now)
        return max(self.size - self.fetched, 0) / r if r > 0 else None


@dataclass
class PullProgress:
    """One pull in flight, however many clients wait for it."""

    reference: str
    started_ns: int
    started: float
    clients: Callable[[], int]
    phase: str = "resolving"
    phase_started: float = 0.0
    layers: list[LayerProgress] = field(default_factory=list)

    def enter(self, phase: str) -> None:
        """The next phase: the last one's duration goes to /metrics."""
        now = time.monotonic()
        metrics.PULL_PHASE_SECONDS.labels(self.phase).observe(now - self.phase_started)
        self.phase, self.phase_started = phase, now

    def shown_phase(self) -> str:
        """The phase as an operator sees it: "unpacking" once every layer is in but
        not every one is unpacked yet (within "downloading" for /metrics, since a
        streamed layer unpacks while it downloads)."""
        if self.phase == "downloading" and self.layers \
                and all(x.done or x.fetched >= x.size for x in self.layers) \
                and not all(x.done for x in self.layers):
            return "unpacking"
        return self.phase

    def fetched(self) -> tuple[int, int]:
        """(bytes fetched, bytes to fetch) over its layers."""
        return sum(x.fetched for x in self.layers), sum(x.size for x in self.layers)

    def fields(self, now: float) -> dict[str, object]:
        """Its state as a log line's fields: phase, bytes, rate, layers done."""
        got, total = self.fetched()
        return {"image": self.reference, "phase": self.shown_phase(),
                "seconds": round(now - self.started, 1), "bytes": got, "total_bytes": total,
                "bytes_per_second": round(sum(x.rate(now) for x in self.layers)),
                "layers_done": sum(1 for x in self.layers if x.done),
                "layers": len(self.layers), "clients": self.clients()}


@dataclass(frozen=True)
class LayerView:
    digest: str
    size: int
    fetched: int
    unpacked: int
    rate: float
    eta: float | None
    endpoint: str
    done: bool


@dataclass(frozen=True)
class PullView:
    """A copy of one pull's state at one moment, for the service and the log."""

    reference: str
    phase: str
    started_ns: int
    seconds: float
    clients: int
    layers: tuple[LayerView, ...]


class Progress:
    """The pulls in flight, by the key their shared task runs under."""

    def __init__(self) -> None:
        self._pulls: dict[object, PullProgress] = {}
        self._layers: dict[str, LayerProgress] = {}  # by chain ID: shared across pulls

    def begin(self, key: object, reference: str, clients: Callable[[], int]) -> PullProgress:
        now = time.monotonic()
        p = PullProgress(reference, time.time_ns(), now, clients, phase_started=now)
        self._pulls[key] = p
        return p

    def end(self, key: object) -> None:
        p = self._pulls.pop(key, None)
        if p is not None:
            p.enter("done")  # the last phase's duration
            live = {id(x) for q in self._pulls.values() for x in q.layers}
            for chain, layer in list(self._layers.items()):
                if id(layer) not in live:
                    del self._layers[chain]

    def layer(self, chain: str, digest: str, size: int) -> LayerProgress:
        """The progress of the layer `chain`, made on first use."""
        layer = self._layers.get(chain)
        if layer is None:
            layer = self._layers[chain] = LayerProgress(digest, size)
        return layer

    def snapshot(self) -> list[PullView]:
        now = time.monotonic()
        return [PullView(p.reference, p.shown_phase(), p.started_ns, now - p.started,
                         p.clients(),
                         tuple(LayerView(x.digest, x.size, x.fetched, x.read(), x.rate(now),
                                         x.eta(now), x.endpoint, x.done) for x in p.layers))
                for p in self._pulls.values()]
