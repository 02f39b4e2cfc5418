#!/usr/bin/env python3
"""Side-by-side CRI benchmark: pycri against containerd, in one run, with ratios.

Not a test. It talks CRI gRPC to two endpoints that are already running (it starts
no daemon; docs/benchmarks.md has the one-time setup) and measures, interleaving the
two endpoints sample by sample or round by round:

  pull      PullImage of an image that is absent (RemoveImage between samples)
  pod       RunPodSandbox / StopPodSandbox / RemovePodSandbox, one at a time
  podpar    the same with --par pods at once, --rounds rounds
  start     RunPodSandbox + CreateContainer + StartContainer (a sleep container)
  mem       --containers pods with one sleep container each, started --par at a
            time (containers/s), then daemon and per-container monitor memory
            (VmRSS, Pss), then List*/Status latencies with all of them present

Run as root (it reads /proc of the daemons and their monitors):

    .venv/bin/python hack/bench.py --pycri unix:///run/pycri-bench/pycri.sock \\
        --containerd unix:///run/containerd/containerd.sock \\
        --image 127.0.0.1:5000/e2e-test-images/busybox:1.29-2 [--containers 50] [--json F]

Every pod it makes carries the label cri-bench-run=<run id>; they are all stopped and
removed at the end, also after an error or ^C.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc

T = TypeVar("T")
RPC_TIMEOUT = 180.0
RUN_LABEL = "cri-bench-run"
NAMESPACE = "cri-bench"
SLEEP_CMD = ["sleep", "3600"]


# ---- statistics ------------------------------------------------------------------------


def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan when empty."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summary(xs: list[float]) -> dict[str, float]:
    return {
        "n": len(xs),
        "p50": percentile(xs, 50),
        "p99": percentile(xs, 99),
        "mean": sum(xs) / len(xs) if xs else float("nan"),
        "max": max(xs) if xs else float("nan"),
    }


# ---- one endpoint ------------------------------------------------------------------------


@dataclass
class Endpoint:
    label: str
    target: str
    log_root: Path
    pid: int | None = None
    channel: grpc.Channel = field(init=False)
    rt: api_pb2_grpc.RuntimeServiceStub = field(init=False)
    img: api_pb2_grpc.ImageServiceStub = field(init=False)
    samples: dict[str, list[float]] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        opts = [("grpc.max_receive_message_length", 64 << 20)]
        self.channel = grpc.insecure_channel(self.target, options=opts)
        self.rt = api_pb2_grpc.RuntimeServiceStub(self.channel)
        self.img = api_pb2_grpc.ImageServiceStub(self.channel)

    def add(self, key: str, seconds: float) -> None:
        self.samples.setdefault(key, []).append(seconds * 1000.0)

    def timed(self, key: str | None, fn: Callable[..., T], req: Any) -> T:
        """Call one RPC; record its latency in ms under `key` (None: not recorded)."""
        t = time.perf_counter()
        resp = fn(req, timeout=RPC_TIMEOUT)
        if key is not None:
            self.add(key, time.perf_counter() - t)
        return resp

    # -- configs --

    def pod_config(self, run_id: str, name: str) -> pb.PodSandboxConfig:
        uid = uuid.uuid4().hex
        log_dir = self.log_root / self.label / f"{name}_{uid[:8]}"
        log_dir.mkdir(parents=True, exist_ok=True)
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=NAMESPACE, attempt=0),
            hostname=name[-63:],
            log_directory=str(log_dir),
            labels={RUN_LABEL: run_id},
            linux=pb.LinuxPodSandboxConfig(),
        )

    def container_config(self, image: str) -> pb.ContainerConfig:
        return pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="sleep", attempt=0),
            image=pb.ImageSpec(image=image),
            command=SLEEP_CMD,
            log_path="sleep.log",
            linux=pb.LinuxContainerConfig(),
        )

    # -- composite operations --

    def run_pod(self, run_id: str, name: str, key: str | None = "RunPodSandbox") -> str:
        cfg = self.pod_config(run_id, name)
        req = pb.RunPodSandboxRequest(config=cfg)
        return self.timed(key, self.rt.RunPodSandbox, req).pod_sandbox_id

    def stop_remove(self, pod_id: str, prefix: str | None = "") -> None:
        """StopPodSandbox + RemovePodSandbox, recorded as <prefix>StopPodSandbox etc."""
        stop = None if prefix is None else f"{prefix}StopPodSandbox"
        rm = None if prefix is None else f"{prefix}RemovePodSandbox"
        self.timed(stop, self.rt.StopPodSandbox, pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))
        self.timed(rm, self.rt.RemovePodSandbox, pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))

    def pod_with_container(self, run_id: str, name: str, image: str,
                           prefix: str | None) -> tuple[str, str]:
        """Run a pod, create and start one sleep container; the total goes under prefix."""
        t0 = time.perf_counter()
        cfg = self.pod_config(run_id, name)
        k = (lambda s: None) if prefix is None else (lambda s: f"{prefix}{s}")
        pod_id = self.timed(k("RunPodSandbox"), self.rt.RunPodSandbox,
                            pb.RunPodSandboxRequest(config=cfg)).pod_sandbox_id
        cid = self.timed(k("CreateContainer"), self.rt.CreateContainer, pb.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=self.container_config(image), sandbox_config=cfg,
        )).container_id
        self.timed(k("StartContainer"), self.rt.StartContainer,
                   pb.StartContainerRequest(container_id=cid))
        if prefix is not None:
            self.add(f"{prefix}total", time.perf_counter() - t0)
        return pod_id, cid

    def ensure_image(self, image: str) -> None:
        st = self.img.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=image)),
                                  timeout=RPC_TIMEOUT)
        if not st.image.id:
            self.img.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=image)),
                               timeout=RPC_TIMEOUT)

    def our_pods(self, run_id: str) -> list[str]:
        resp = self.rt.ListPodSandbox(pb.ListPodSandboxRequest(
            filter=pb.PodSandboxFilter(label_selector={RUN_LABEL: run_id})), timeout=RPC_TIMEOUT)
        return [p.id for p in resp.items]

    def cleanup(self, run_id: str) -> int:
        """Stop and remove this run's pods; one that fails does not stop the others
        (it is printed, and left for a second pass)."""

        def one(pod: str) -> bool:
            try:
                self.stop_remove(pod, prefix=None)
                return True
            except grpc.RpcError as e:
                print(f"  [{self.label}] cleanup of {pod[:12]}: {e.code().name}: "
                      f"{(e.details() or '')[:160]}", file=sys.stderr, flush=True)
                return False

        pods = self.our_pods(run_id)
        with ThreadPoolExecutor(8) as ex:
            removed = sum(ex.map(one, pods))
        shutil.rmtree(self.log_root / self.label, ignore_errors=True)
        return removed


# ---- /proc -------------------------------------------------------------------------------


def read_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def proc_status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            out[k] = v.strip()
    except OSError:
        pass
    return out


def rss_kb(pid: int) -> int:
    v = proc_status(pid).get("VmRSS", "0 kB")
    return int(v.split()[0])


def pss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (not its children)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def socket_owner(path: str) -> int | None:
    """Pid of the process holding the listening unix socket bound to `path`."""
    inodes: set[str] = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 8 and parts[7] == path:
            inodes.add(parts[6])
    if not inodes:
        return None
    want = {f"socket:[{i}]" for i in inodes}
    for pid in all_pids():
        if pid == os.getpid():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in want:
                    return pid
        except OSError:
            continue
    return None


def socket_path(target: str) -> str:
    return target.removeprefix("unix://") if target.startswith("unix://") else target


@dataclass
class ProcGroup:
    pids: list[int]
    rss_kb: int
    pss_kb: int


def group(pids: Iterable[int]) -> ProcGroup:
    ps = sorted(pids)
    return ProcGroup(ps, sum(rss_kb(p) for p in ps), sum(pss_kb(p) or 0 for p in ps))


def monitors_of(ids: set[str], daemon: int | None) -> tuple[ProcGroup, ProcGroup, ProcGroup]:
    """(monitors, infra processes, workload processes) of the given pod/container IDs.

    A monitor (conmon, containerd-shim-runc-v2) is a process whose command line names one
    of the IDs; container processes are its children: `sleep` ones are the workload, the
    others (pause, catatonit) the pod infra.
    """
    mons: set[int] = set()
    ppid: dict[int, int] = {}
    for pid in all_pids():
        st = proc_status(pid)
        if not st:
            continue
        ppid[pid] = int(st.get("PPid", "0"))
        if pid == daemon:
            continue
        cmd = read_cmdline(pid)
        if any(a in ids for a in cmd):
            mons.add(pid)
    children = [p for p, pp in ppid.items() if pp in mons and p not in mons]
    work = [p for p in children if read_cmdline(p) == SLEEP_CMD]
    infra = [p for p in children if p not in work]
    return group(mons), group(infra), group(work)


# ---- phases --------------------------------------------------------------------------------


def alternate(eps: list[T], i: int) -> list[T]:
    """Both endpoints (or what stands for them), the order flipped on every other sample."""
    return eps if i % 2 == 0 else list(reversed(eps))


def guard(ep: Endpoint, what: str, fn: Callable[..., T], *args: Any) -> T | None:
    """fn(*args); an RPC error is recorded and printed, and gives None."""
    try:
        return fn(*args)
    except grpc.RpcError as e:
        msg = f"{what}: {e.code().name}: {e.details()}"
        ep.errors.append(msg)
        print(f"  [{ep.label}] ERROR {msg}", file=sys.stderr, flush=True)
        return None


def phase_pull(eps: list[Endpoint], image: str, samples: int) -> None:
    print(f"== pull: {samples} x PullImage {image} (RemoveImage before each)", flush=True)
    for ep in eps:
        others = [i for i in ep.img.ListImages(pb.ListImagesRequest(), timeout=RPC_TIMEOUT).images
                  if image not in i.repo_tags]
        if others:
            tags = [t for i in others for t in i.repo_tags] or [others[0].id]
            print(f"  [{ep.label}] note: {len(others)} other image(s) present, shared layers "
                  f"make the pull warmer: {', '.join(tags[:5])}", flush=True)
    spec = pb.ImageSpec(image=image)
    for i in range(samples):
        for ep in alternate(eps, i):
            guard(ep, "RemoveImage", ep.timed, "RemoveImage", ep.img.RemoveImage,
                  pb.RemoveImageRequest(image=spec))
            guard(ep, "PullImage", ep.timed, "PullImage", ep.img.PullImage,
                  pb.PullImageRequest(image=spec))
    for ep in eps:
        ep.samples["RemoveImage"] = ep.samples.get("RemoveImage", [])[1:]  # 1st: maybe absent


def phase_pod_seq(eps: list[Endpoint], run_id: str, n: int) -> None:
    print(f"== pod: {n} x RunPodSandbox, then Stop+Remove, one at a time", flush=True)
    for i in range(n):
        for ep in alternate(eps, i):
            pod = guard(ep, "RunPodSandbox", ep.run_pod, run_id, f"seq-{i}",
                        "seq.RunPodSandbox")
            if pod:
                guard(ep, "Stop/RemovePodSandbox", ep.stop_remove, pod, "seq.")


def phase_pod_par(eps: list[Endpoint], run_id: str, par: int, rounds: int) -> None:
    print(f"== podpar: {rounds} rounds of {par} RunPodSandbox at once, then Stop+Remove "
          "at once", flush=True)
    with ThreadPoolExecutor(par) as ex:
        for r in range(rounds):
            for ep in alternate(eps, r):
                t = time.perf_counter()
                futs = [ex.submit(guard, ep, "RunPodSandbox", ep.run_pod, run_id,
                                  f"par-{r}-{j}", "par.RunPodSandbox") for j in range(par)]
                pods = [p for p in (f.result() for f in futs) if p]
                ep.add("par.round_wall", time.perf_counter() - t)
                futs = [ex.submit(guard, ep, "Stop/RemovePodSandbox", ep.stop_remove, p, "par.")
                        for p in pods]
                for f in futs:
                    f.result()


def phase_start(eps: list[Endpoint], run_id: str, image: str, n: int) -> None:
    print(f"== start: {n} x RunPodSandbox+CreateContainer+StartContainer, one at a time",
          flush=True)
    for i in range(n):
        for ep in alternate(eps, i):
            r = guard(ep, "pod+container", ep.pod_with_container, run_id, f"start-{i}", image,
                      "start.")
            if r:
                guard(ep, "Stop/RemovePodSandbox", ep.stop_remove, r[0], "start.")


def phase_mem(ep: Endpoint, run_id: str, image: str, n: int, par: int, list_n: int,
              settle: float) -> None:
    print(f"== mem [{ep.label}]: {n} pods x 1 sleep container, {par} at a time", flush=True)
    if ep.pid:
        ep.values["daemon_rss_idle_kb"] = rss_kb(ep.pid)
        ep.values["daemon_pss_idle_kb"] = pss_kb(ep.pid) or 0
        cpu0 = cpu_seconds(ep.pid)
    t = time.perf_counter()
    with ThreadPoolExecutor(par) as ex:
        futs = [ex.submit(guard, ep, "pod+container", ep.pod_with_container, run_id,
                          f"mem-{j}", image, "mem.") for j in range(n)]
        res = [f.result() for f in futs]
    wall = time.perf_counter() - t
    started = [r for r in res if r]
    ep.values["mem.started"] = len(started)
    ep.values["mem.start_wall_s"] = wall
    ep.values["mem.containers_per_s"] = len(started) / wall if wall else float("nan")
    if ep.pid:
        ep.values["mem.daemon_cpu_s_per_container"] = (
            (cpu_seconds(ep.pid) - cpu0) / max(len(started), 1))
    time.sleep(settle)

    ids = {p for p, _ in started} | {c for _, c in started}
    mons, infra, work = monitors_of(ids, ep.pid)
    k = max(len(started), 1)
    if ep.pid:
        ep.values["daemon_rss_kb"] = rss_kb(ep.pid)
        ep.values["daemon_pss_kb"] = pss_kb(ep.pid) or 0
    ep.values["monitor_count"] = len(mons.pids)
    ep.values["monitor_rss_kb_total"] = mons.rss_kb
    ep.values["monitor_pss_kb_total"] = mons.pss_kb
    ep.values["monitor_rss_kb_per_container"] = mons.rss_kb / k
    ep.values["monitor_pss_kb_per_container"] = mons.pss_kb / k
    ep.values["infra_count"] = len(infra.pids)
    ep.values["infra_rss_kb_per_pod"] = infra.rss_kb / k
    ep.values["infra_pss_kb_per_pod"] = infra.pss_kb / k
    ep.values["workload_count"] = len(work.pids)
    ep.values["overhead_pss_kb_per_pod"] = (mons.pss_kb + infra.pss_kb) / k

    print(f"== list [{ep.label}]: {list_n} x List*/Status with {len(started)} containers",
          flush=True)
    cids = [c for _, c in started] or [""]
    pids = [p for p, _ in started] or [""]
    rnd = random.Random(1)
    n_seen = 0
    for _ in range(list_n):
        r = guard(ep, "ListContainers", ep.timed, "ListContainers", ep.rt.ListContainers,
                  pb.ListContainersRequest())
        n_seen = len(r.containers) if r else n_seen
        guard(ep, "ListPodSandbox", ep.timed, "ListPodSandbox", ep.rt.ListPodSandbox,
              pb.ListPodSandboxRequest())
        guard(ep, "ContainerStatus", ep.timed, "ContainerStatus", ep.rt.ContainerStatus,
              pb.ContainerStatusRequest(container_id=rnd.choice(cids)))
        guard(ep, "PodSandboxStatus", ep.timed, "PodSandboxStatus", ep.rt.PodSandboxStatus,
              pb.PodSandboxStatusRequest(pod_sandbox_id=rnd.choice(pids)))
    ep.values["list.containers_seen"] = n_seen

    print(f"== teardown [{ep.label}]: Stop+Remove {len(started)} pods, {par} at a time",
          flush=True)
    t = time.perf_counter()
    with ThreadPoolExecutor(par) as ex:
        futs = [ex.submit(guard, ep, "Stop/RemovePodSandbox", ep.stop_remove, p, "mem.")
                for p, _ in started]
        for f in futs:
            f.result()
    ep.values["mem.teardown_wall_s"] = time.perf_counter() - t
    if ep.pid:
        time.sleep(settle)
        ep.values["daemon_rss_after_kb"] = rss_kb(ep.pid)
    left, _, _ = monitors_of(ids, ep.pid)
    ep.values["monitors_left_after_teardown"] = len(left.pids)


# ---- report --------------------------------------------------------------------------------

LAT_ROWS = [
    ("PullImage (absent)", "PullImage"),
    ("RemoveImage", "RemoveImage"),
    ("RunPodSandbox, sequential", "seq.RunPodSandbox"),
    ("StopPodSandbox, sequential", "seq.StopPodSandbox"),
    ("RemovePodSandbox, sequential", "seq.RemovePodSandbox"),
    ("RunPodSandbox, parallel", "par.RunPodSandbox"),
    ("StopPodSandbox, parallel", "par.StopPodSandbox"),
    ("RemovePodSandbox, parallel", "par.RemovePodSandbox"),
    ("round of N parallel RunPodSandbox (wall)", "par.round_wall"),
    ("pod+container start: total", "start.total"),
    ("  RunPodSandbox", "start.RunPodSandbox"),
    ("  CreateContainer", "start.CreateContainer"),
    ("  StartContainer", "start.StartContainer"),
    ("  StopPodSandbox (pod with container)", "start.StopPodSandbox"),
    ("  RemovePodSandbox (pod with container)", "start.RemovePodSandbox"),
    ("pod+container start under load: total", "mem.total"),
    ("ListContainers (N present)", "ListContainers"),
    ("ListPodSandbox (N present)", "ListPodSandbox"),
    ("ContainerStatus (N present)", "ContainerStatus"),
    ("PodSandboxStatus (N present)", "PodSandboxStatus"),
]

VAL_ROWS = [
    ("containers started (mem phase)", "mem.started", 1.0, "{:.0f}"),
    ("containers/s, sequential (1/mean total)", "start.cps", 1.0, "{:.2f}"),
    ("containers/s, N started P at a time", "mem.containers_per_s", 1.0, "{:.2f}"),
    ("teardown of N pods, wall s", "mem.teardown_wall_s", 1.0, "{:.2f}"),
    ("daemon CPU s per pod+container start", "mem.daemon_cpu_s_per_container", 1.0, "{:.3f}"),
    ("daemon RSS idle, MiB", "daemon_rss_idle_kb", 1024.0, "{:.1f}"),
    ("daemon RSS with N containers, MiB", "daemon_rss_kb", 1024.0, "{:.1f}"),
    ("daemon PSS with N containers, MiB", "daemon_pss_kb", 1024.0, "{:.1f}"),
    ("daemon RSS after teardown, MiB", "daemon_rss_after_kb", 1024.0, "{:.1f}"),
    ("monitor processes (conmon / shim)", "monitor_count", 1.0, "{:.0f}"),
    ("monitor RSS total, MiB", "monitor_rss_kb_total", 1024.0, "{:.1f}"),
    ("monitor RSS per pod (1 container), KiB", "monitor_rss_kb_per_container", 1.0, "{:.0f}"),
    ("monitor PSS per pod (1 container), KiB", "monitor_pss_kb_per_container", 1.0, "{:.0f}"),
    ("infra processes (catatonit / pause)", "infra_count", 1.0, "{:.0f}"),
    ("infra RSS per pod, KiB", "infra_rss_kb_per_pod", 1.0, "{:.0f}"),
    ("monitor+infra PSS per pod, KiB", "overhead_pss_kb_per_pod", 1.0, "{:.0f}"),
    ("monitors left after teardown", "monitors_left_after_teardown", 1.0, "{:.0f}"),
]


def fmt_ratio(a: float, b: float) -> str:
    if b == 0 or a != a or b != b:
        return "-"
    return f"{a / b:.2f}"


def report(a: Endpoint, b: Endpoint) -> str:
    for ep in (a, b):
        tot = ep.samples.get("start.total")
        if tot:
            ep.values["start.cps"] = 1000.0 / (sum(tot) / len(tot))
    w = 50
    lines = [f"{'latency, ms':<{w}} {'':>4} {a.label:>10} {b.label:>10} {'ratio':>6}",
             "-" * (w + 34)]
    for name, key in LAT_ROWS:
        sa, sb = a.samples.get(key), b.samples.get(key)
        if not sa and not sb:
            continue
        n = len(sa or sb or [])
        for q in (50, 99):
            va, vb = percentile(sa or [], q), percentile(sb or [], q)
            label = f"{name} (n={n})" if q == 50 else ""
            lines.append(f"{label:<{w}} p{q:<3} {va:>10.1f} {vb:>10.1f} {fmt_ratio(va, vb):>6}")
    lines += ["", f"{'throughput and memory':<{w}} {'':>4} {a.label:>10} {b.label:>10} "
              f"{'ratio':>6}", "-" * (w + 34)]
    for name, key, div, f in VAL_ROWS:
        if key not in a.values and key not in b.values:
            continue
        va, vb = a.values.get(key, float("nan")) / div, b.values.get(key, float("nan")) / div
        lines.append(f"{name:<{w}} {'':>4} {f.format(va):>10} {f.format(vb):>10} "
                     f"{fmt_ratio(va, vb):>6}")
    lines.append("")
    lines.append(f"ratio = {a.label}/{b.label}: below 1 is better for {a.label} on latency, "
                 "memory and CPU; above 1 is better on containers/s.")
    return "\n".join(lines)


def print_errors(eps: list[Endpoint], most: int = 20) -> None:
    for ep in eps:
        if ep.errors:
            print(f"\n{ep.label}: {len(ep.errors)} error(s), the first ones:")
            for e in ep.errors[:most]:
                print(f"  {e}")


def version(ep: Endpoint) -> str:
    v = ep.rt.Version(pb.VersionRequest(), timeout=10)
    return f"{v.runtime_name} {v.runtime_version}"


def endpoint_args(ap: argparse.ArgumentParser) -> None:
    """The options every side-by-side script takes: the two endpoints and the image."""
    ap.add_argument("--pycri", default="unix:///run/pycri-bench/pycri.sock")
    ap.add_argument("--containerd", default="unix:///run/containerd/containerd.sock")
    ap.add_argument("--image", default="127.0.0.1:5000/e2e-test-images/busybox:1.29-2")
    ap.add_argument("--pycri-pid", type=int, help="daemon pid (default: socket owner)")
    ap.add_argument("--containerd-pid", type=int, help="daemon pid (default: socket owner)")
    ap.add_argument("--log-root", default="/var/tmp/cri-bench-logs", type=Path)


def open_endpoints(args: argparse.Namespace, run_id: str) -> tuple[Endpoint, Endpoint]:
    """(pycri, containerd) from `endpoint_args`' options, daemon pids found, versions shown."""
    a = Endpoint("pycri", args.pycri, args.log_root / run_id, args.pycri_pid)
    b = Endpoint("containerd", args.containerd, args.log_root / run_id, args.containerd_pid)
    for ep in (a, b):
        ep.pid = ep.pid or socket_owner(socket_path(ep.target))
        print(f"{ep.label}: {ep.target} ({version(ep)}), daemon pid {ep.pid}", flush=True)
        if ep.pid is None:
            print(f"  [{ep.label}] daemon pid unknown: no memory/CPU figures", file=sys.stderr)
    return a, b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    endpoint_args(ap)
    ap.add_argument("--pull-image", help="image for the pull phase (default: --image)")
    ap.add_argument("--containers", type=int, default=50, help="N for the memory/list phase")
    ap.add_argument("--seq", type=int, default=30, help="sequential pod samples")
    ap.add_argument("--par", type=int, default=10, help="pods at once")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --par pods")
    ap.add_argument("--start", type=int, default=20, help="pod+container start samples")
    ap.add_argument("--pulls", type=int, default=10, help="pull samples")
    ap.add_argument("--lists", type=int, default=200, help="List*/Status samples")
    ap.add_argument("--settle", type=float, default=3.0, help="s to wait before reading memory")
    ap.add_argument("--phases", default="pull,pod,podpar,start,mem",
                    help="comma-separated subset of pull,pod,podpar,start,mem")
    ap.add_argument("--json", type=Path, help="write samples and results here")
    args = ap.parse_args()
    phases = set(args.phases.split(","))
    unknown = phases - {"pull", "pod", "podpar", "start", "mem"}
    if unknown:
        ap.error(f"unknown phase(s): {', '.join(sorted(unknown))}")

    run_id = f"{int(time.time())}-{os.getpid()}"
    a, b = open_endpoints(args, run_id)
    eps = [a, b]
    print(f"host: {platform.node()} {platform.release()}, {os.cpu_count()} CPUs; run {run_id}",
          flush=True)

    t0 = time.time()
    try:
        if "pull" in phases:
            phase_pull(eps, args.pull_image or args.image, args.pulls)
        for ep in eps:
            ep.ensure_image(args.image)
        print("== warm-up: 2 pod+container cycles each (not recorded)", flush=True)
        for i in range(2):
            for ep in eps:
                r = guard(ep, "warm-up", ep.pod_with_container, run_id, f"warm-{i}",
                          args.image, None)
                if r:
                    guard(ep, "warm-up", ep.stop_remove, r[0], None)
        if "pod" in phases:
            phase_pod_seq(eps, run_id, args.seq)
        if "podpar" in phases:
            phase_pod_par(eps, run_id, args.par, args.rounds)
        if "start" in phases:
            phase_start(eps, run_id, args.image, args.start)
        if "mem" in phases:
            for ep in eps:
                phase_mem(ep, run_id, args.image, args.containers, args.par, args.lists,
                          args.settle)
    finally:
        for ep in eps:
            try:
                n = ep.cleanup(run_id)
                if n:
                    print(f"cleanup [{ep.label}]: removed {n} leftover pod(s)", flush=True)
            except grpc.RpcError as err:
                print(f"cleanup [{ep.label}] failed: {err}", file=sys.stderr)
        shutil.rmtree(args.log_root / run_id, ignore_errors=True)

    print()
    print(report(a, b))
    print_errors(eps)
    print(f"\ntotal {time.time() - t0:.0f} s")
    if args.json:
        doc = {
            "run_id": run_id, "host": platform.node(), "kernel": platform.release(),
            "cpus": os.cpu_count(), "args": {k: str(v) for k, v in vars(args).items()},
            "endpoints": {ep.label: {
                "target": ep.target, "version": version(ep), "pid": ep.pid,
                "summary": {k: summary(v) for k, v in ep.samples.items()},
                "values": ep.values, "samples_ms": ep.samples, "errors": ep.errors,
            } for ep in eps},
        }
        args.json.write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.json}")
    return 1 if any(ep.errors for ep in eps) else 0


if __name__ == "__main__":
    sys.exit(main())
