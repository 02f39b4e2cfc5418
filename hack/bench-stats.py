#!/usr/bin/env python3
"""The stats path of two pycri trees side by side: ContainerStats, ListContainerStats,
PodSandboxStats, ListPodSandboxStats and ListPodSandboxMetrics with N pods present.

Not a test. It starts a loopback registry with the busybox test image and one
`pycri serve` per tree (`--tree LABEL=DIR`, default: this tree as "this"), each on its
own root, socket and CNI bridge, runs --pods pods with one sleep container each on
every daemon, then, round by round in rotating order, times blocks of --block calls of
each RPC on each daemon: latency of every call (ms) and the daemon's CPU time per call
(the on-CPU time of all its threads, from schedstat). It prints medians, p90 and
the ratio to the first tree, with the load average before and after.

Run as root from the repository:
    .venv/bin/python hack/bench-stats.py --tree before=/var/tmp/old-tree --tree after=. \\
        [--pods 50] [--rounds 20] [--json F]
Everything it made (daemons by pid, pods, bridges, mounts) is removed at the end, also
after an error or ^C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pycri.api import api_pb2 as pb  # noqa: E402
from tests.conftest import CRIClient, PycriProcess  # noqa: E402
from tests.lib import images  # noqa: E402
from tests.lib.registry import Registry  # noqa: E402

sys.path.insert(0, str(REPO / "hack"))
from benchlib import TIMEOUT, private_daemon, quantile, sleep_pod, start, tear_down  # noqa: E402

CALLS = ("ContainerStats", "ListContainerStats", "PodSandboxStats", "ListPodSandboxStats",
         "ListPodSandboxMetrics")


def cpu_seconds(pid: int) -> float:
    """On-CPU time of every thread of `pid` (schedstat: nanoseconds, where /proc/PID/stat
    counts 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


@dataclass
class Daemon:
    label: str
    tmp: Path
    bridge: str
    image: str
    proc: PycriProcess
    cri: CRIClient | None = None
    pods: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    latency: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)  # ms per call, by block

    def start(self) -> None:
        self.cri = start(self.proc, self.image)

    def pod_with_container(self, n: int) -> tuple[str, str]:
        assert self.cri is not None
        cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=f"s{n}", namespace="bench-stats", uid=f"u{n}"),
            log_directory=str(self.tmp / "logs" / f"s{n}"))
        return sleep_pod(self.cri, cfg, self.image)

    def populate(self, n: int, par: int) -> None:
        with ThreadPoolExecutor(par) as ex:
            for sid, cid in ex.map(self.pod_with_container, range(n)):
                self.pods.append(sid)
                self.containers.append(cid)

    def call(self, name: str, rnd: random.Random) -> Callable[[], Any]:
        assert self.cri is not None
        rt = self.cri.runtime
        requests: dict[str, Callable[[], Any]] = {
            "ContainerStats": lambda: rt.ContainerStats(pb.ContainerStatsRequest(
                container_id=rnd.choice(self.containers)), timeout=TIMEOUT),
            "ListContainerStats": lambda: rt.ListContainerStats(
                pb.ListContainerStatsRequest(), timeout=TIMEOUT),
            "PodSandboxStats": lambda: rt.PodSandboxStats(pb.PodSandboxStatsRequest(
                pod_sandbox_id=rnd.choice(self.pods)), timeout=TIMEOUT),
            "ListPodSandboxStats": lambda: rt.ListPodSandboxStats(
                pb.ListPodSandboxStatsRequest(), timeout=TIMEOUT),
            "ListPodSandboxMetrics": lambda: rt.ListPodSandboxMetrics(
                pb.ListPodSandboxMetricsRequest(), timeout=TIMEOUT),
        }
        return requests[name]

    def block(self, name: str, calls: int, rnd: random.Random) -> None:
        assert self.proc.proc is not None
        fn = self.call(name, rnd)
        cpu0 = cpu_seconds(self.proc.proc.pid)
        for _ in range(calls):
            t = time.perf_counter()
            fn()
            self.latency.setdefault(name, []).append((time.perf_counter() - t) * 1000)
        used = cpu_seconds(self.proc.proc.pid) - cpu0
        self.cpu.setdefault(name, []).append(used * 1000 / calls)

    def close(self) -> None:
        tear_down(self.cri, self.proc, self.tmp, self.bridge)


def make_daemon(label: str, tree: Path, tmp: Path, image: str, n: int, tag: str) -> Daemon:
    bridge = f"pcs{tag}{n}"[:15]
    proc = private_daemon(tmp, bridge, f"10.196.{n + 10 * (int(tag, 16) % 20)}.0/24",
                          "[nri]\nenable = false\n", tree)
    return Daemon(label, tmp, bridge, image, proc)


@contextlib.contextmanager
def daemons(trees: list[tuple[str, Path]], base: Path, image: str) -> Iterator[list[Daemon]]:
    tag = secrets.token_hex(1)
    made: list[Daemon] = []
    try:
        for n, (label, tree) in enumerate(trees):
            d = make_daemon(label, tree, base / label, image, n, tag)
            made.append(d)
            d.start()
        yield made
    finally:
        for d in made:
            d.close()


def report(ds: list[Daemon]) -> str:
    first = ds[0]
    head = ["op"] + [f"{d.label} p50" for d in ds] + [f"{d.label} p90" for d in ds] + [
        f"{d.label} cpu/call" for d in ds]
    if len(ds) > 1:
        head += [f"{d.label}/{first.label} p50" for d in ds[1:]]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for name in CALLS:
        p50 = [quantile(d.latency[name], 0.5) for d in ds]
        row = [name] + [f"{v:.2f} ms" for v in p50]
        row += [f"{quantile(d.latency[name], 0.9):.2f} ms" for d in ds]
        row += [f"{quantile(d.cpu[name], 0.5):.2f} ms" for d in ds]
        row += [f"{v / p50[0]:.2f}" for v in p50[1:]]
        lines.append(" | ".join(row))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                    help="a pycri source tree to run (repeatable; default: this one)")
    ap.add_argument("--pods", type=int, default=50, help="pods with one container each")
    ap.add_argument("--par", type=int, default=4, help="pods started at a time")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=5, help="calls per timed block")
    ap.add_argument("--settle", type=float, default=3.0, help="s before the first round")
    ap.add_argument("--json", type=Path, help="write every sample here")
    args = ap.parse_args()
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree] or [
        ("this", REPO)]
    with tempfile.TemporaryDirectory(prefix="bench-stats-", dir="/var/tmp") as tmp:
        base = Path(tmp)
        os.chdir(base)  # `python -m pycri` puts its cwd first on the path, before PYTHONPATH
        reg = Registry(base / "registry")
        reg.start()
        try:
            image = images.push_busybox(reg.addr, base / "layout")
            with daemons(trees, base, image) as ds:
                for d in ds:
                    print(f"== {d.label}: {args.pods} pods x 1 sleep container", flush=True)
                    d.populate(args.pods, args.par)
                time.sleep(args.settle)
                load0 = os.getloadavg()
                rnd = random.Random(1)
                for r in range(args.rounds):
                    for name in CALLS:
                        for d in ds[r % len(ds):] + ds[:r % len(ds)]:
                            d.block(name, args.block, rnd)
                load1 = os.getloadavg()
                print(report(ds))
                print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
                      f"after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; "
                      f"{args.rounds} rounds x {args.block} calls per op and tree; "
                      f"{os.cpu_count()} CPUs")
                if args.json:
                    args.json.write_text(json.dumps({
                        d.label: {"latency_ms": d.latency, "cpu_ms_per_call": d.cpu}
                        for d in ds}, indent=1))
        finally:
            reg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
