#!/usr/bin/env python3
"""One node, both runtimes, one run: the CRI ops table, memory and CPU at scale, with ratios.

Not a test. Talks CRI gRPC to two daemons already running (pycri and containerd; it
starts neither) and prints, for both, side by side with the ratio pycri/containerd:

  ops     critest -benchmark's table: CreatePod, StatusPod, StopPod, RemovePod,
          container Create+Start, StatusContainer, Stop+Remove, StatusImage,
          ListImages; medians (and p99) of --n samples, the endpoints alternating
          sample by sample, one call at a time
  scale   for each size of --sizes (e.g. 100,500) both nodes are filled to that many
          pods with one sleep container each, --par at a time; then
            start rate     pods/s (pod + container started) over the last --rate-window
                           pods of the fill, --par in parallel
            memory         daemon VmRSS and Pss; growth per pod against the previous size
            read path      --reads samples of the kubelet's read calls, endpoints alternating
            idle CPU       daemon utime+stime over --poll-seconds while a kubelet-like
                           poller runs against both nodes at once (below), as % of a core
            monitors       conmon / containerd-shim RSS per pod

The kubelet-like poll (kubelet defaults, no probes): PLEG relist every 1 s
(ListPodSandbox + ListContainers); every pod's status (PodSandboxStatus, then
ContainerStatus of its container) once per --pod-sync s, spread over the period, as the
pod workers' resync does; ListPodSandboxStats + ListContainerStats every 10 s (the
eviction manager and summary API's housekeeping). Also the daemon's CPU with no
poll at all over the same window, so the poll's own cost shows.

Run as root (it reads /proc of the daemons):

    .venv/bin/python hack/bench-node.py --pycri unix:///run/pycri-bench/pycri.sock \\
        [--containerd unix:///run/containerd/containerd.sock] [--sizes 100,500] [--n 20]

Every pod carries the label cri-bench-run=<run id>; all are stopped and removed at the
end, also after an error, ^C or SIGTERM (started in the background by a script, it
ignores SIGINT as such jobs do: stop it with SIGTERM). A shared containerd may run
other users' pods: the pods each daemon held at every point are printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (
    Endpoint,
    alternate,
    cpu_seconds,
    endpoint_args,
    fmt_ratio,
    guard,
    monitors_of,
    open_endpoints,
    percentile,
    print_errors,
    pss_kb,
    rss_kb,
    summary,
    version,
)

from pycri.api import api_pb2 as pb

# (row label, sample key) of the ops table, in critest's order.
OPS = [
    ("CreatePod", "ops.CreatePod"),
    ("StatusPod", "ops.StatusPod"),
    ("StopPod", "ops.StopPod"),
    ("RemovePod", "ops.RemovePod"),
    ("container Create+Start", "ops.CreateStart"),
    ("StatusContainer", "ops.StatusContainer"),
    ("container Stop+Remove", "ops.StopRemove"),
    ("StatusImage", "ops.StatusImage"),
    ("ListImages", "ops.ListImages"),
]
READS = ["ListPodSandbox", "ListContainers", "PodSandboxStatus", "ContainerStatus",
         "ImageStatus", "ListContainerStats", "Version", "Status"]
RELIST_S = 1.0
STATS_S = 10.0


def _spec(image: str) -> pb.ImageSpec:
    return pb.ImageSpec(image=image)


# ---- ops table ---------------------------------------------------------------------------


def ops_cycle(ep: Endpoint, run_id: str, image: str, i: int) -> None:
    """One sample of every row: a pod, its status, a container in it, ..., gone again."""
    t = ep.timed
    cfg = ep.pod_config(run_id, f"ops-{i}")
    pod = t("ops.CreatePod", ep.rt.RunPodSandbox, pb.RunPodSandboxRequest(config=cfg))
    pid = pod.pod_sandbox_id
    t("ops.StatusPod", ep.rt.PodSandboxStatus, pb.PodSandboxStatusRequest(pod_sandbox_id=pid))
    t0 = time.perf_counter()
    cid = ep.rt.CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=pid, config=ep.container_config(image), sandbox_config=cfg),
        timeout=60).container_id
    ep.rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
    ep.add("ops.CreateStart", time.perf_counter() - t0)
    t("ops.StatusContainer", ep.rt.ContainerStatus, pb.ContainerStatusRequest(container_id=cid))
    t0 = time.perf_counter()
    ep.rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0), timeout=60)
    ep.rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=60)
    ep.add("ops.StopRemove", time.perf_counter() - t0)
    t("ops.StopPod", ep.rt.StopPodSandbox, pb.StopPodSandboxRequest(pod_sandbox_id=pid))
    t("ops.RemovePod", ep.rt.RemovePodSandbox, pb.RemovePodSandboxRequest(pod_sandbox_id=pid))
    t("ops.StatusImage", ep.img.ImageStatus, pb.ImageStatusRequest(image=_spec(image)))
    t("ops.ListImages", ep.img.ListImages, pb.ListImagesRequest())


def phase_ops(eps: list[Endpoint], run_id: str, image: str, n: int) -> None:
    print(f"== ops: {n} samples of the critest-benchmark table, endpoints alternating",
          flush=True)
    for i in range(n):
        for ep in alternate(eps, i):
            guard(ep, "ops cycle", ops_cycle, ep, run_id, image, i)


# ---- scale -------------------------------------------------------------------------------


class Node:
    """One endpoint's pods of this run, grown step by step; figures per size."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self.pods: list[tuple[str, str]] = []  # (pod id, container id)
        self.at: dict[int, dict[str, float]] = {}

    def fill(self, run_id: str, image: str, size: int, par: int, window: int) -> None:
        ep, want = self.ep, size - len(self.pods)
        if want <= 0:
            return
        print(f"== fill [{ep.label}]: {len(self.pods)} -> {size} pods, {par} at a time",
              flush=True)
        done: list[float] = []
        lock = threading.Lock()
        base = len(self.pods)

        def one(j: int) -> tuple[str, str] | None:
            r = guard(ep, "pod+container", ep.pod_with_container, run_id,
                      f"scale-{base + j}", image, f"fill{size}.")
            with lock:
                done.append(time.perf_counter())
            return r

        t0 = time.perf_counter()
        ex = ThreadPoolExecutor(par)
        try:
            got = list(ex.map(one, range(want)))
        finally:  # on ^C: no new pod, the ones under way finish (and the cleanup finds them)
            ex.shutdown(wait=True, cancel_futures=True)
        self.pods += [r for r in got if r]
        done.sort()
        k = min(window, len(done) - 1)
        fig = self.at.setdefault(size, {})
        fig["fill_pods_per_s"] = want / (done[-1] - t0) if done else float("nan")
        fig["rate_pods_per_s"] = k / (done[-1] - done[-1 - k]) if k > 0 else float("nan")
        fig["started"] = len(self.pods)

    def memory(self, size: int) -> None:
        ep, fig = self.ep, self.at.setdefault(size, {})
        if ep.pid:
            fig["rss_kb"] = rss_kb(ep.pid)
            fig["pss_kb"] = pss_kb(ep.pid) or 0
        ids = {p for p, _ in self.pods} | {c for _, c in self.pods}
        mons, _, _ = monitors_of(ids, ep.pid)
        fig["monitor_rss_kb_per_pod"] = mons.rss_kb / max(len(self.pods), 1)
        fig["monitor_pss_kb_per_pod"] = mons.pss_kb / max(len(self.pods), 1)
        fig["pods_on_node"] = len(ep.rt.ListPodSandbox(pb.ListPodSandboxRequest(),
                                                       timeout=60).items)

    def read_once(self, rnd: random.Random, image: str, size: int) -> None:
        ep, k = self.ep, f"read{size}."
        pid, cid = rnd.choice(self.pods) if self.pods else ("", "")
        calls: list[tuple[str, Callable[..., Any], Any]] = [
            ("ListPodSandbox", ep.rt.ListPodSandbox, pb.ListPodSandboxRequest()),
            ("ListContainers", ep.rt.ListContainers, pb.ListContainersRequest()),
            ("PodSandboxStatus", ep.rt.PodSandboxStatus,
             pb.PodSandboxStatusRequest(pod_sandbox_id=pid)),
            ("ContainerStatus", ep.rt.ContainerStatus,
             pb.ContainerStatusRequest(container_id=cid)),
            ("ImageStatus", ep.img.ImageStatus, pb.ImageStatusRequest(image=_spec(image))),
            ("ListContainerStats", ep.rt.ListContainerStats, pb.ListContainerStatsRequest()),
            ("Version", ep.rt.Version, pb.VersionRequest()),
            ("Status", ep.rt.Status, pb.StatusRequest()),
        ]
        for name, fn, req in calls:
            guard(ep, name, ep.timed, k + name, fn, req)


def phase_reads(nodes: list[Node], image: str, size: int, n: int) -> None:
    print(f"== reads at {size} pods: {n} x {', '.join(READS)}, endpoints alternating",
          flush=True)
    rnd = random.Random(size)
    for i in range(n):
        for node in alternate(nodes, i):
            node.read_once(rnd, image, size)


class Poller(threading.Thread):
    """The kubelet's steady-state calls against one node, until `stop` is set."""

    def __init__(self, node: Node, pod_sync: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.node, self.pod_sync, self.stop_ev = node, pod_sync, stop
        self.calls = 0
        self.failed: dict[str, int] = {}  # first line of the error: how often

    def call(self, fn: Callable[..., Any], req: Any) -> None:
        try:
            fn(req, timeout=30)
        except grpc.RpcError as e:
            msg = f"{type(req).__name__}: {e.code().name}: {(e.details() or '')[:120]}"
            self.failed[msg] = self.failed.get(msg, 0) + 1
        self.calls += 1

    def run(self) -> None:
        rt, pods = self.node.ep.rt, list(self.node.pods)
        t0 = time.monotonic()
        next_relist, next_stats, synced = t0, t0, 0
        while not self.stop_ev.is_set():
            now = time.monotonic()
            if now >= next_relist:
                self.call(rt.ListPodSandbox, pb.ListPodSandboxRequest())
                self.call(rt.ListContainers, pb.ListContainersRequest())
                next_relist += RELIST_S
            if now >= next_stats:
                self.call(rt.ListPodSandboxStats, pb.ListPodSandboxStatsRequest())
                self.call(rt.ListContainerStats, pb.ListContainerStatsRequest())
                next_stats += STATS_S
            # every pod once per pod_sync, spread evenly: the pods due by now
            due = int((now - t0) / self.pod_sync * len(pods)) if pods else 0
            while synced < due:
                pid, cid = pods[synced % len(pods)]
                self.call(rt.PodSandboxStatus, pb.PodSandboxStatusRequest(pod_sandbox_id=pid))
                self.call(rt.ContainerStatus, pb.ContainerStatusRequest(container_id=cid))
                synced += 1
            self.stop_ev.wait(0.05)


def phase_cpu(nodes: list[Node], size: int, seconds: float, pod_sync: float) -> None:
    """Daemon CPU over `seconds` quiet, then over `seconds` under the poll (both nodes)."""
    print(f"== cpu at {size} pods: {seconds:.0f} s quiet, then {seconds:.0f} s under the "
          f"kubelet-like poll (pod sync every {pod_sync:.0f} s)", flush=True)
    for label, poll in (("quiet", False), ("poll", True)):
        stop = threading.Event()
        pollers = [Poller(n, pod_sync, stop) for n in nodes] if poll else []
        c0 = [cpu_seconds(n.ep.pid) if n.ep.pid else float("nan") for n in nodes]
        t0 = time.monotonic()
        for p in pollers:
            p.start()
        time.sleep(seconds)
        stop.set()
        for p in pollers:
            p.join()
        wall = time.monotonic() - t0
        for n, c in zip(nodes, c0, strict=True):
            used = (cpu_seconds(n.ep.pid) - c) if n.ep.pid else float("nan")
            n.at.setdefault(size, {})[f"cpu_{label}_pct"] = 100.0 * used / wall
        for n, p in zip(nodes, pollers, strict=False):
            n.at[size]["poll_calls_per_s"] = p.calls / wall
            n.at[size]["poll_failed"] = sum(p.failed.values())
            for msg, k in p.failed.items():  # not the bench's errors: the node's state
                print(f"  [{n.ep.label}] poll: {k} x {msg}", flush=True)


# ---- report ------------------------------------------------------------------------------


def ops_table(a: Endpoint, b: Endpoint) -> list[str]:
    """critest's layout: containerd first, ratio = pycri / containerd."""
    lines = [f"| op (n) | {b.label} p50 ms | {a.label} p50 ms | ratio p50 | "
             f"{b.label} p99 | {a.label} p99 |", "|---|---|---|---|---|---|"]
    for name, key in OPS:
        sa, sb = a.samples.get(key, []), b.samples.get(key, [])
        ma, mb = percentile(sa, 50), percentile(sb, 50)
        lines.append(f"| {name} ({min(len(sa), len(sb))}) | {mb:.1f} | {ma:.1f} | "
                     f"{fmt_ratio(ma, mb)} | {percentile(sb, 99):.1f} | "
                     f"{percentile(sa, 99):.1f} |")
    return lines


def growth(node: Node, sizes: list[int]) -> dict[int, float]:
    """Daemon RSS growth per pod, KiB, from the previous size (the first: from idle)."""
    out, prev_n, prev_kb = {}, 0, node.ep.values.get("rss_idle_kb", float("nan"))
    for s in sizes:
        kb = node.at.get(s, {}).get("rss_kb", float("nan"))
        out[s] = (kb - prev_kb) / (s - prev_n)
        prev_n, prev_kb = s, kb
    return out


def scale_table(na: Node, nb: Node, sizes: list[int]) -> list[str]:
    lo, hi = sizes[0], sizes[-1]
    head = ["| figure |"] + [f" {n.ep.label} @{s} |" for n in (nb, na) for s in sizes]
    ratio_cols = [f" {na.ep.label} {hi}/{lo} |", f" {nb.ep.label} {hi}/{lo} |"] if hi != lo \
        else []
    head += ratio_cols + [f" {na.ep.label}/{nb.ep.label} @{s} |" for s in sizes]
    lines = ["".join(head), "|---" * (len(head)) + "|"]
    ga, gb = growth(na, sizes), growth(nb, sizes)
    for n, g in ((na, ga), (nb, gb)):
        for s in sizes:
            n.at.setdefault(s, {})["growth_kb_per_pod"] = g[s]

    def row(name: str, get: Callable[[Node, int], float], f: str = "{:.1f}") -> None:
        cells = [f.format(get(n, s)) for n in (nb, na) for s in sizes]
        if hi != lo:
            cells += [fmt_ratio(get(na, hi), get(na, lo)), fmt_ratio(get(nb, hi), get(nb, lo))]
        cells += [fmt_ratio(get(na, s), get(nb, s)) for s in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    def fig(key: str, div: float = 1.0) -> Callable[[Node, int], float]:
        return lambda n, s: n.at.get(s, {}).get(key, float("nan")) / div

    def lat(op: str, q: int) -> Callable[[Node, int], float]:
        return lambda n, s: percentile(n.ep.samples.get(f"read{s}.{op}", []), q)

    row("pods on the node (all users)", fig("pods_on_node"), "{:.0f}")
    row("start rate, pods/s (last pods of the fill)", fig("rate_pods_per_s"), "{:.2f}")
    row("fill rate, pods/s (whole step)", fig("fill_pods_per_s"), "{:.2f}")
    row("daemon RSS, MiB", fig("rss_kb", 1024))
    row("daemon Pss, MiB", fig("pss_kb", 1024))
    row("daemon RSS growth per pod, KiB", fig("growth_kb_per_pod"), "{:.0f}")
    row("monitor RSS per pod, KiB", fig("monitor_rss_kb_per_pod"), "{:.0f}")
    row("monitor Pss per pod, KiB", fig("monitor_pss_kb_per_pod"), "{:.0f}")
    row("daemon CPU quiet, % of a core", fig("cpu_quiet_pct"), "{:.2f}")
    row("daemon CPU under kubelet poll, % of a core", fig("cpu_poll_pct"), "{:.2f}")
    row("poll calls/s", fig("poll_calls_per_s"))
    row("poll calls failed", fig("poll_failed"), "{:.0f}")
    for op in READS:
        row(f"{op} p50 ms", lat(op, 50), "{:.2f}")
        row(f"{op} p99 ms", lat(op, 99), "{:.2f}")
    return lines


def idle_lines(a: Endpoint, b: Endpoint) -> list[str]:
    lines = ["| idle (before the run) | " + b.label + " | " + a.label + " | ratio |",
             "|---|---|---|---|"]
    for name, key in (("daemon RSS, MiB", "rss_idle_kb"), ("daemon Pss, MiB", "pss_idle_kb"),
                      ("pods on the node", "pods_idle")):
        div = 1 if key == "pods_idle" else 1024
        va, vb = a.values.get(key, float("nan")) / div, b.values.get(key, float("nan")) / div
        lines.append(f"| {name} | {vb:.1f} | {va:.1f} | {fmt_ratio(va, vb)} |")
    return lines


# ---- main --------------------------------------------------------------------------------


def _sigterm(_sig: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    endpoint_args(ap)
    ap.add_argument("--n", type=int, default=20, help="samples per row of the ops table")
    ap.add_argument("--sizes", default="100,500", help="pods per node, ascending")
    ap.add_argument("--par", type=int, default=10, help="pods started at once in a fill")
    ap.add_argument("--rate-window", type=int, default=50, help="last pods of a fill timed")
    ap.add_argument("--reads", type=int, default=100, help="read-path samples per size")
    ap.add_argument("--poll-seconds", type=float, default=60.0)
    ap.add_argument("--pod-sync", type=float, default=10.0,
                    help="s in which the poll reads every pod's status once")
    ap.add_argument("--cpu-sizes", default="", help="sizes with the CPU phase (default: first)")
    ap.add_argument("--settle", type=float, default=5.0, help="s before reading memory")
    ap.add_argument("--skip-ops", action="store_true")
    ap.add_argument("--json", type=Path, help="write all samples and figures here")
    args = ap.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    cpu_sizes = {int(s) for s in args.cpu_sizes.split(",") if s} or set(sizes[:1])
    signal.signal(signal.SIGTERM, _sigterm)

    run_id = f"node-{int(time.time())}-{os.getpid()}"
    a, b = open_endpoints(args, run_id)
    eps = [a, b]
    load0 = os.getloadavg()
    print(f"host: {platform.node()} {platform.release()}, {os.cpu_count()} CPUs, "
          f"load {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; run {run_id}", flush=True)
    nodes = [Node(a), Node(b)]
    loads: dict[str, tuple[float, float, float]] = {"start": load0}
    t0 = time.time()
    interrupted = False
    try:
        for ep in eps:  # idle: before this run's first call that does anything
            if ep.pid:
                ep.values["rss_idle_kb"] = rss_kb(ep.pid)
                ep.values["pss_idle_kb"] = pss_kb(ep.pid) or 0
            ep.values["pods_idle"] = len(ep.rt.ListPodSandbox(pb.ListPodSandboxRequest(),
                                                              timeout=60).items)
            ep.ensure_image(args.image)
        print("== warm-up: 2 ops cycles each (not recorded)", flush=True)
        for i in range(2):
            for ep in eps:
                guard(ep, "warm-up", ops_cycle, ep, run_id, args.image, -1 - i)
        for ep in eps:
            ep.samples.clear()
        if not args.skip_ops:
            phase_ops(eps, run_id, args.image, args.n)
            loads["ops"] = os.getloadavg()
        for size in sizes:
            for node in nodes:
                node.fill(run_id, args.image, size, args.par, args.rate_window)
            time.sleep(args.settle)
            for node in nodes:
                node.memory(size)
            phase_reads(nodes, args.image, size, args.reads)
            if size in cpu_sizes:
                phase_cpu(nodes, size, args.poll_seconds, args.pod_sync)
            loads[f"@{size}"] = os.getloadavg()
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: cleaning up", file=sys.stderr, flush=True)
    finally:
        prev = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a 2nd ^C must not skip the cleanup
        for ep in eps:
            try:
                t = time.perf_counter()
                n = ep.cleanup(run_id)
                print(f"cleanup [{ep.label}]: removed {n} pod(s) in "
                      f"{time.perf_counter() - t:.0f} s", flush=True)
            except grpc.RpcError as err:
                print(f"cleanup [{ep.label}] failed: {err}", file=sys.stderr)
        shutil.rmtree(args.log_root / run_id, ignore_errors=True)
        signal.signal(signal.SIGINT, prev)
    if interrupted:
        print("\nINTERRUPTED: the figures below are what was measured before ^C")

    print(f"\nops: n={args.n}, one call at a time, medians; ratio = {a.label}/{b.label} "
          "(below 1: pycri faster)\n")
    print("\n".join(idle_lines(a, b)))
    if not args.skip_ops:
        print()
        print("\n".join(ops_table(a, b)))
    print(f"\nscale: {args.par} pods at a time, {args.reads} read samples per size, "
          f"CPU over {args.poll_seconds:.0f} s at {sorted(cpu_sizes)}\n")
    print("\n".join(scale_table(nodes[0], nodes[1], sizes)))
    print("\nload average (1, 5, 15 min): " + "; ".join(
        f"{k} {v[0]:.2f} {v[1]:.2f} {v[2]:.2f}" for k, v in loads.items()))
    print_errors(eps)
    print(f"\ntotal {time.time() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({
            "run_id": run_id, "host": platform.node(), "cpus": os.cpu_count(),
            "args": {k: str(v) for k, v in vars(args).items()}, "load": loads,
            "endpoints": {n.ep.label: {
                "target": n.ep.target, "version": version(n.ep), "pid": n.ep.pid,
                "idle": n.ep.values, "at": n.at, "errors": n.ep.errors,
                "summary": {k: summary(v) for k, v in n.ep.samples.items()},
            } for n in nodes},
        }, indent=1))
        print(f"wrote {args.json}")
    return 130 if interrupted else 1 if any(ep.errors for ep in eps) else 0


if __name__ == "__main__":
    sys.exit(main())
