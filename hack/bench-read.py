#!/usr/bin/env python3
"""The CRI read path, pycri against containerd, interleaved sample by sample.

Not a test. It talks CRI gRPC to two running endpoints (it starts no daemon), sets up
--pods pods with one sleep container each on both, then times the calls the kubelet
makes every second -- ContainerStatus, PodSandboxStatus, ImageStatus, ListContainers,
ListPodSandbox, ListImages, Version, Status -- one endpoint after the other, the order
flipped on every round:

  quiet   nothing else runs on either endpoint
  load    meanwhile a worker process per endpoint keeps --load pods starting at once
          (RunPodSandbox + CreateContainer + StartContainer, then Stop + Remove, again)

and prints p50/p99 per call and runtime, with the ratios against containerd's p50 that
issue 12 sets (quiet p50 <= 1x, loaded p99 <= 2x) and the load average. --baseline adds
a second pycri (say, main's build) to the same rounds: before and after in one window.

    .venv/bin/python hack/bench-read.py --pycri unix:///run/pycri-bench/pycri.sock \\
        --containerd unix:///run/containerd/containerd.sock [--rounds 2000] [--json F]

Every pod carries the label cri-bench-run=<run id> and is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench
from bench import Endpoint, guard, percentile, socket_owner, socket_path

from pycri.api import api_pb2 as pb

Call = tuple[str, Callable[[], Any]]


def read_calls(ep: Endpoint, image: str, pod: str, ctr: str) -> list[Call]:
    """The read RPCs, bound to one endpoint's subject pod and container."""
    rt, img = ep.rt, ep.img
    return [
        ("ContainerStatus", lambda: rt.ContainerStatus(
            pb.ContainerStatusRequest(container_id=ctr))),
        ("PodSandboxStatus", lambda: rt.PodSandboxStatus(
            pb.PodSandboxStatusRequest(pod_sandbox_id=pod))),
        ("ImageStatus", lambda: img.ImageStatus(
            pb.ImageStatusRequest(image=pb.ImageSpec(image=image)))),
        ("ListContainers", lambda: rt.ListContainers(pb.ListContainersRequest())),
        ("ListPodSandbox", lambda: rt.ListPodSandbox(pb.ListPodSandboxRequest())),
        ("ListImages", lambda: img.ListImages(pb.ListImagesRequest())),
        ("Version", lambda: rt.Version(pb.VersionRequest())),
        ("Status", lambda: rt.Status(pb.StatusRequest())),
    ]


def sample(eps: list[Endpoint], calls: dict[str, list[Call]], rounds: int, tag: str) -> None:
    """`rounds` rounds of every call on every endpoint, interleaved call by call, the
    endpoints' order rotated from one call to the next."""
    names = [n for n, _ in calls[eps[0].label]]
    for i in range(rounds):
        for k, name in enumerate(names):
            turn = (i * len(names) + k) % len(eps)
            for ep in eps[turn:] + eps[:turn]:
                fn = calls[ep.label][k][1]
                t = time.perf_counter()
                try:
                    fn()
                except grpc.RpcError as e:
                    ep.errors.append(f"{name}: {e.code().name}: {e.details()}")
                    continue
                ep.add(f"{tag}.{name}", time.perf_counter() - t)


# ---- the load worker (a process of its own: its threads must not share our GIL) -------------


def load_worker(target: str, run_id: str, image: str, par: int, log_root: Path) -> int:
    ep = Endpoint("load", target, log_root)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cycles = [0] * par

    def loop(j: int) -> None:
        while not stop.is_set():
            r = guard(ep, "pod+container", ep.pod_with_container, run_id,
                      f"load-{j}-{cycles[j]}", image, None)
            if r:
                guard(ep, "Stop/RemovePodSandbox", ep.stop_remove, r[0], None)
            cycles[j] += 1

    threads = [threading.Thread(target=loop, args=(j,)) for j in range(par)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"cycles": sum(cycles), "errors": len(ep.errors)}), flush=True)
    return 0


def start_load(ep: Endpoint, run_id: str, image: str, par: int,
               log_root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--load-worker", ep.target, "--run-id", run_id,
         "--image", image, "--load", str(par), "--log-root", str(log_root)],
        stdout=subprocess.PIPE, text=True)


def stop_load(p: subprocess.Popen[str]) -> dict[str, int]:
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=300)
    lines = out.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


# ---- the floor: grpc.aio answering with no work at all ------------------------------------


def floor_server(path: str) -> int:
    """A bare grpc.aio server answering each read RPC with an empty, pre-built message
    (never a NotFound): what grpc-python costs per call before any runtime work."""
    import asyncio

    from pycri.api import api_pb2_grpc

    class Empty(api_pb2_grpc.RuntimeServiceServicer, api_pb2_grpc.ImageServiceServicer):
        pass

    for name in READS:
        answer = getattr(pb, f"{name}Response")()

        async def handler(self: Any, request: Any, context: Any, answer: Any = answer) -> Any:
            return answer
        setattr(Empty, name, handler)

    async def serve() -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_RuntimeServiceServicer_to_server(Empty(), server)
        api_pb2_grpc.add_ImageServiceServicer_to_server(Empty(), server)
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop(None)

    asyncio.run(serve())
    return 0


READS = ["ContainerStatus", "PodSandboxStatus", "ImageStatus", "ListContainers",
         "ListPodSandbox", "ListImages", "Version", "Status"]


# ---- report ---------------------------------------------------------------------------------


def report(eps: list[Endpoint], names: list[str]) -> str:
    """p50 quiet and p99 loaded per call and endpoint, each against containerd's p50."""
    ref = next(ep for ep in eps if ep.label == "containerd")
    head = f"{'call':<17}" + "".join(f" {ep.label + ' p50':>16}" for ep in eps) + \
        "".join(f" {ep.label + ' p99L':>17}" for ep in eps)
    lines = [head, "-" * len(head)]
    for n in names:
        base = percentile(ref.samples.get(f"quiet.{n}", []), 50)
        row = f"{n:<17}"
        for tag, q in (("quiet", 50), ("load", 99)):
            for ep in eps:
                v = percentile(ep.samples.get(f"{tag}.{n}", []), q)
                row += f" {v:>8.3f} ({v / base:>5.2f})"
        lines.append(row)
    lines.append("")
    lines.append("ms (in brackets: / containerd's quiet p50); p50 quiet; p99L = p99 while "
                 "every endpoint starts --load pods at once")
    return "\n".join(lines)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pycri", default="unix:///run/pycri-bench/pycri.sock")
    ap.add_argument("--containerd", default="unix:///run/containerd/containerd.sock")
    ap.add_argument("--baseline", help="a second pycri (another build: before/after)")
    ap.add_argument("--floor", action="store_true",
                    help="also time a bare grpc.aio server that does no work (quiet phase)")
    ap.add_argument("--floor-server", help=argparse.SUPPRESS)
    ap.add_argument("--image", default="127.0.0.1:5000/e2e-test-images/busybox:1.29-2")
    ap.add_argument("--pods", type=int, default=10, help="pods (1 container each) present")
    ap.add_argument("--rounds", type=int, default=1000, help="rounds per phase")
    ap.add_argument("--load", type=int, default=10, help="pods starting at once (load phase)")
    ap.add_argument("--phases", default="quiet,load")
    ap.add_argument("--log-root", default="/var/tmp/cri-bench-logs", type=Path)
    ap.add_argument("--json", type=Path, help="write samples and results here")
    ap.add_argument("--load-worker", help=argparse.SUPPRESS)
    ap.add_argument("--run-id", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load_worker:
        return load_worker(args.load_worker, args.run_id, args.image, args.load, args.log_root)
    if args.floor_server:
        return floor_server(args.floor_server)

    bench.RPC_TIMEOUT = 900.0  # pod set-up on a node under load: minutes, not a failure
    run_id = f"read-{int(time.time())}-{os.getpid()}"
    log_root = args.log_root / run_id
    eps = [Endpoint("pycri", args.pycri, log_root)]
    if args.baseline:
        eps.append(Endpoint("baseline", args.baseline, log_root))
    eps.append(Endpoint("containerd", args.containerd, log_root))
    floor = None
    if args.floor:
        path = f"/run/bench-read-floor-{os.getpid()}.sock"
        floor = subprocess.Popen([sys.executable, __file__, "--floor-server", path])
        eps.append(Endpoint("grpc-floor", f"unix://{path}", log_root))
        time.sleep(2)
    for ep in eps:
        ep.pid = socket_owner(socket_path(ep.target))
        v = ep.rt.Version(pb.VersionRequest(), timeout=10)
        print(f"{ep.label}: {ep.target} ({v.runtime_name} {v.runtime_version}), pid {ep.pid}",
              flush=True)
    calls: dict[str, list[Call]] = {}
    info: dict[str, Any] = {"run_id": run_id, "args": {k: str(v) for k, v in vars(args).items()}}
    def setup(ep: Endpoint) -> list[Call]:
        if ep.label == "grpc-floor":
            return read_calls(ep, args.image, "pod", "ctr")
        ep.ensure_image(args.image)
        made = [ep.pod_with_container(run_id, f"read-{j}", args.image, None)
                for j in range(args.pods)]
        return read_calls(ep, args.image, *made[0])

    try:
        with ThreadPoolExecutor(len(eps)) as ex:  # a loaded node takes minutes per pod
            for ep, made in zip(eps, ex.map(setup, eps), strict=True):
                calls[ep.label] = made
        names = [n for n, _ in calls["pycri"]]
        sample(eps, calls, 50, "warm")
        if "quiet" in args.phases:
            info["load_quiet_before"] = loadavg()
            print(f"== quiet: {args.rounds} rounds, load average {info['load_quiet_before']}",
                  flush=True)
            sample(eps, calls, args.rounds, "quiet")
        runtimes = [ep for ep in eps if ep.label != "grpc-floor"]  # what can start pods
        if "load" in args.phases:
            workers = [start_load(ep, run_id, args.image, args.load, log_root)
                       for ep in runtimes]
            try:
                time.sleep(3)  # let the cycles get going
                info["load_loaded_before"] = loadavg()
                sample(runtimes, calls, args.rounds, "load")
                info["load_loaded_after"] = loadavg()
            finally:
                info["load_cycles"] = [stop_load(w) for w in workers]
            print(f"== load: {args.rounds} rounds, load average "
                  f"{info['load_loaded_before']} .. {info['load_loaded_after']}, "
                  f"pod cycles {info['load_cycles']}", flush=True)
    finally:
        if floor is not None:
            floor.terminate()
            floor.wait()
            Path(str(floor.args[-1])).unlink(missing_ok=True)
        for ep in eps:
            if ep.label == "grpc-floor":
                continue
            try:
                ep.cleanup(run_id)
            except grpc.RpcError as err:
                print(f"cleanup [{ep.label}] failed: {err}", file=sys.stderr)
    print()
    print(report(eps, names))
    for ep in eps:
        if ep.errors:
            print(f"{ep.label}: {len(ep.errors)} error(s), first: {ep.errors[0]}")
    if args.json:
        info["endpoints"] = {ep.label: {"pid": ep.pid, "samples_ms": ep.samples,
                                        "errors": ep.errors} for ep in eps}
        args.json.write_text(json.dumps(info))
    return 1 if any(ep.errors for ep in eps) else 0


if __name__ == "__main__":
    sys.exit(main())
