#!/usr/bin/env python3
"""Restart at node scale: pycri against containerd after kill -9, in one run.

Not a test. For each size in --pods it brings both runtimes to that many running pods
(one `sleep` container each), then, --restarts times and alternating which goes
first, kills each daemon with SIGKILL and starts it again, and measures from the
instant the new process is started:

  first     the first answer to Version (the socket serves again)
  rechecked pycri only: the recheck has learnt every pod's and container's state
            (`recovery.doneAt` in Status verbose info; 0 pending)

after which every pod must still be READY and every container RUNNING. The floor
is pycri's first answer from an empty state (--empty samples, a fresh root each).

pycri is run by this script (from the tree this script is in) under --work;
containerd is the harness's (started once with start-containerd.sh, then restarted
with the same command line), on a socket, bridge and subnet of its own. Run as root:

    .venv/bin/python hack/bench-restart.py --pods 100,500 [--restarts 3] \\
        [--image 127.0.0.1:5000/e2e-test-images/busybox:1.29-2] [--json F]

At the end (also after an error or ^C) every pod is removed and both daemons stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import Endpoint, summary

from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc

REPO = Path(__file__).resolve().parent.parent
HARNESS = Path("/work/shared/critest-harness")
# Reconnect fast: the default backoff (1 s and up) would hide the instant of the answer.
FAST = [("grpc.initial_reconnect_backoff_ms", 5), ("grpc.min_reconnect_backoff_ms", 5),
        ("grpc.max_reconnect_backoff_ms", 10)]
START_LIMIT = 300.0


def first_answer(target: str, t0: float) -> float:
    """Seconds from `t0` (monotonic) until `target` answers Version (containerd serves
    its socket before its CRI plugin is ready and says so: not an answer)."""
    with grpc.insecure_channel(target, options=FAST) as ch:
        stub = api_pb2_grpc.RuntimeServiceStub(ch)
        while True:
            try:
                stub.Version(pb.VersionRequest(), timeout=START_LIMIT, wait_for_ready=True)
                return time.monotonic() - t0
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNKNOWN or time.monotonic() - t0 > START_LIMIT:
                    raise
                time.sleep(0.005)


class Pycri:
    """A pycri daemon of this tree, on a root and state of its own under `work`."""

    label = "pycri"

    def __init__(self, work: Path, image: str, bridge: str = "rstp0",
                 subnet: str = "10.86.0.0/16") -> None:
        self.work = work
        self.sock = work / "state" / "pycri.sock"
        self.target = f"unix://{self.sock}"
        self.proc: subprocess.Popen[bytes] | None = None
        net = work / "net.d"
        net.mkdir(parents=True, exist_ok=True)
        (net / "10-bench.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "bench-restart", "plugins": [
                {"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(work / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
                {"type": "loopback"}]}))
        registry = image.split("/", 1)[0]
        (work / "registries.conf").write_text(
            f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
        (work / "registries.conf.d").mkdir(exist_ok=True)
        self.config = work / "pycri.toml"
        self.config.write_text(
            '[cadvisor]\ndefault_path = ""\n'  # the host's path: never linked by a bench
            f'[images]\nregistries_conf = "{work / "registries.conf"}"\n'
            f'registries_conf_dir = "{work / "registries.conf.d"}"\n'
            f'[cni]\nconf_dir = "{net}"\n')

    def start(self, root: Path | None = None) -> float:
        """Start the daemon; seconds until it answers Version."""
        root = root or self.work
        argv = [sys.executable, "-m", "pycri", "serve", "--config", str(self.config),
                "--root", str(root / "root"), "--state", str(root / "state"),
                "--socket", str(root / "state" / "pycri.sock"), "--log-level", "info"]
        # Byte-compiled, as an installed package is (see main); never recompiled per start.
        env = dict(os.environ, PYTHONPATH=str(REPO))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        with open(root / "pycri.log", "ab") as log:
            t0 = time.monotonic()
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        self.t0_wall = time.time_ns() - int((time.monotonic() - t0) * 1e9)
        return first_answer(f"unix://{root / 'state' / 'pycri.sock'}", t0)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def logged_start(self, root: Path | None = None) -> tuple[float, float]:
        """From the daemon's serving line: how long `Daemon.start` took (records loaded,
        missed exits read, socket bound) and the process's age then (interpreter and
        imports included): what the wall figures owe to pycri, and to the machine."""
        text = ((root or self.work) / "pycri.log").read_text(errors="replace")
        found = re.findall(r"loaded, ([0-9.]+)s after the start, ([0-9.]+)s after the exec",
                           text)
        return (float(found[-1][0]), float(found[-1][1])) if found else (0.0, 0.0)

    def rechecked(self, ep: Endpoint) -> float:
        """Seconds from the start until the recheck had learnt every state."""
        while True:
            info = ep.rt.Status(pb.StatusRequest(verbose=True), timeout=60).info
            if "recovery" not in info:  # a pycri that rechecks before it serves
                return (time.time_ns() - self.t0_wall) / 1e9
            rec = json.loads(info["recovery"])
            if rec.get("pending") == 0 and rec.get("doneAt"):
                return (int(rec["doneAt"]) - self.t0_wall) / 1e9
            time.sleep(0.02)


class Containerd:
    """The critest harness's Debian containerd, on a socket and network of its own."""

    label = "containerd"

    def __init__(self, work: Path) -> None:
        self.env = dict(os.environ, HARNESS_WORK=str(work),
                        CONTAINERD_SOCK=str(work / "containerd.sock"),
                        CNI_BRIDGE="rstc0", CNI_SUBNET="10.85.0.0/16")
        self.sock = work / "containerd.sock"
        self.target = f"unix://{self.sock}"
        self.pidfile = work / "containerd.pid"
        self.log = work / "containerd" / "containerd.log"
        self.argv: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None

    def first_start(self) -> None:
        subprocess.run([str(HARNESS / "start-containerd.sh")], env=self.env, check=True)
        pid = int(self.pidfile.read_text())
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        self.argv = [a.decode() for a in raw.split(b"\0") if a]

    def kill9(self) -> None:
        pid = int(self.pidfile.read_text())
        os.kill(pid, signal.SIGKILL)
        if self.proc is not None and self.proc.pid == pid:
            self.proc.wait()
        else:  # the harness's child, re-parented to init: wait until it is gone
            while Path(f"/proc/{pid}").exists():
                time.sleep(0.01)

    def start(self) -> float:
        """Start it again with the harness's command line; seconds until it answers."""
        with open(self.log, "ab") as log:
            t0 = time.monotonic()
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.pidfile.write_text(f"{self.proc.pid}\n")
        return first_answer(self.target, t0)

    def stop(self) -> None:
        subprocess.run([str(HARNESS / "stop-containerd.sh")], env=self.env, check=False)


def grow(ep: Endpoint, run_id: str, image: str, have: int, want: int, par: int) -> str:
    """Bring `ep` from `have` to `want` running pods of one sleep container each; says
    how long it took."""
    t = time.monotonic()
    with ThreadPoolExecutor(par) as ex:
        list(ex.map(lambda i: ep.pod_with_container(run_id, f"r{i}", image, None),
                    range(have, want)))
    return f"[{ep.label}] {want} pods running (+{want - have} in {time.monotonic() - t:.0f} s)"


def check_all_running(ep: Endpoint, run_id: str, n: int) -> str:
    """'' if `n` pods are READY and their `n` containers RUNNING, else what is not."""
    sel = {"cri-bench-run": run_id}
    pods = ep.rt.ListPodSandbox(pb.ListPodSandboxRequest(
        filter=pb.PodSandboxFilter(label_selector=sel)), timeout=120).items
    ids = {p.id for p in pods}
    ready = sum(p.state == pb.SANDBOX_READY for p in pods)
    cs = [c for c in ep.rt.ListContainers(pb.ListContainersRequest(), timeout=120).containers
          if c.pod_sandbox_id in ids]
    running = sum(c.state == pb.CONTAINER_RUNNING for c in cs)
    if ready == running == len(pods) == len(cs) == n:
        return ""
    return f"{ready}/{len(pods)} pods ready, {running}/{len(cs)} containers running of {n}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", default="100,500", help="comma-separated sizes, increasing")
    ap.add_argument("--restarts", type=int, default=3, help="kill -9 restarts per size")
    ap.add_argument("--empty", type=int, default=3, help="empty-state starts of pycri")
    ap.add_argument("--par", type=int, default=4, help="pods started at a time")
    ap.add_argument("--image", default="127.0.0.1:5000/e2e-test-images/busybox:1.29-2")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/bench-restart"))
    ap.add_argument("--no-containerd", action="store_true", help="pycri alone")
    ap.add_argument("--json", type=Path, help="write the samples here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.pods.split(",")]
    run_id = f"{int(time.time())}-{os.getpid()}"
    if str(args.work) + "/" in Path("/proc/self/mountinfo").read_text():
        ap.error(f"something is still mounted under {args.work} (a run cut short?)")
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    logs = args.work / "pod-logs"

    # pip byte-compiles an installed package; a source tree run with
    # PYTHONDONTWRITEBYTECODE (as here) would recompile every module at every start.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "pycri")], check=True)
    py = Pycri(args.work / "pycri", args.image)
    daemons: list[Pycri | Containerd] = [py]
    if not args.no_containerd:
        daemons.append(Containerd(args.work / "containerd"))
    results: dict[str, dict[str, list[float]]] = {d.label: {} for d in daemons}
    eps: dict[str, Endpoint] = {}
    print(f"host: {platform.node()} {platform.release()}, {os.cpu_count()} CPUs; run {run_id}",
          flush=True)
    t_run = time.time()
    try:
        for i in range(args.empty):
            empty = args.work / f"empty{i}"
            empty.mkdir()
            results["pycri"].setdefault("empty first", []).append(py.start(empty))
            py.stop()
            start, age = py.logged_start(empty)
            results["pycri"].setdefault("empty start", []).append(start)
            results["pycri"].setdefault("empty age", []).append(age)
            shutil.rmtree(empty, ignore_errors=True)
        print(f"pycri empty-state first answer: {results['pycri'].get('empty first')}, "
              f"Daemon.start {results['pycri'].get('empty start')}, "
              f"age {results['pycri'].get('empty age')}; load {os.getloadavg()}", flush=True)
        py.start()
        for d in daemons:
            if isinstance(d, Containerd):
                d.first_start()
            eps[d.label] = Endpoint(d.label, d.target, logs / run_id)
            eps[d.label].ensure_image(args.image)
        have = 0
        for n in sizes:
            # Both grow at once: on a machine others load, each gets its share of it
            # for the same wall time (the restarts below are one at a time).
            with ThreadPoolExecutor(len(daemons)) as ex:
                grown = [ex.submit(grow, eps[d.label], run_id, args.image, have, n, args.par)
                         for d in daemons]
                for f in grown:
                    print(f.result(), flush=True)
            have = n
            for r in range(args.restarts):
                for d in daemons if r % 2 == 0 else list(reversed(daemons)):
                    eps[d.label].channel.close()
                    eps[d.label] = ep = Endpoint(d.label, d.target, logs / run_id)
                    d.kill9()
                    first = d.start()
                    res = results[d.label]
                    res.setdefault(f"{n} first", []).append(first)
                    line = f"[{d.label}] {n} pods, restart {r + 1}: first answer {first:.3f} s"
                    if isinstance(d, Pycri):
                        full = d.rechecked(ep)
                        res.setdefault(f"{n} rechecked", []).append(full)
                        start, age = d.logged_start()
                        res.setdefault(f"{n} start", []).append(start)
                        res.setdefault(f"{n} age", []).append(age)
                        line += (f", rechecked {full:.3f} s (Daemon.start {start:.3f} s, "
                                 f"process age {age:.2f} s when serving)")
                    if bad := check_all_running(ep, run_id, n):
                        line += f"; WRONG after the restart: {bad}"
                        res.setdefault("errors", []).append(float(n))
                    print(f"{line}; load {os.getloadavg()[0]:.1f}", flush=True)
                    time.sleep(3)  # let the other daemon's restart settle
    finally:
        for label, ep in eps.items():
            try:
                print(f"cleanup [{label}]: removed {ep.cleanup(run_id)} pod(s)", flush=True)
            except grpc.RpcError as err:
                print(f"cleanup [{label}] failed: {err}", file=sys.stderr)
        for d in daemons:
            d.stop()
        subprocess.run(["ip", "link", "del", "rstp0"], capture_output=True)
        subprocess.run(["ip", "link", "del", "rstc0"], capture_output=True)

    print("\n| runtime | measure | n | median s | max s |\n|---|---|---|---|---|")
    for label, res in results.items():
        for key, xs in res.items():
            if key != "errors":
                s = summary(xs)
                print(f"| {label} | {key} | {s['n']} | {s['p50']:.3f} | {s['max']:.3f} |")
    print(f"\ntotal {time.time() - t_run:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"run_id": run_id, "host": platform.node(),
                                         "kernel": platform.release(), "results": results},
                                        indent=1))
    return 1 if any("errors" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
