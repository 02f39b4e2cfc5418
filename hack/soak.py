#!/usr/bin/env python3
"""Chaos soak: kill -9 a private pycri at random instants inside RPCs, then count leaks.

Not a test (it runs for many minutes). It starts its own loopback registry with
the busybox test image (or uses `--image`), its own `pycri serve` (private root,
state, socket, CNI network with its own bridge and subnet) and `--clients`
threads that each churn their own pods: RunPodSandbox → CreateContainer →
StartContainer → ExecSync → Stop/Remove, with pulls, lists and status calls in
between. A killer thread SIGKILLs the daemon (by pid) after a random `--gap`
(sometimes `--long-gap`) while the clients are mid-call, restarts it and, with every
client parked, checks what each client was told:
  - a pod or container whose create returned OK and that was not removed since
    is listed, in a state consistent with the calls that returned OK
    (started → not CREATED, stopped → EXITED / NOTREADY);
  - nothing that was removed successfully comes back.
Objects whose call was cut short may or may not exist; each client then removes
its unknown and in-doubt objects (they must be removable) and goes on. After
`--kills` kills (or `--minutes`) everything is removed, the daemon is stopped
and the leftovers are counted (hack/soak_leaks.py). Exit status 1 on any loss,
unexpected error, hang or leak.

`--base-pods N` keeps N more pods (one long-running container each) on the node
for the whole run, so that every restart has a node's worth of records to serve
and recheck; each must stay READY with its container RUNNING. A restart whose
socket does not answer Version within `--hang-after` seconds is a hang: py-spy's
native dump of the stuck daemon and its log tail go to `<work>/hang-<n>.txt` and
the run stops (the daemon is then killed and restarted to remove everything).

    .venv/bin/python hack/soak.py --kills 1000 --json /var/tmp/chaos/result.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak_leaks import leftovers

from pycri.api import api_pb2 as pb
from tests.conftest import CRIClient, PycriProcess
from tests.lib import images
from tests.lib.registry import Registry

# One network per run (two soaks at once must not share a bridge or a subnet).
RUN = os.getpid() % 250
BRIDGE = f"pcchaos{RUN}"
SUBNET = f"10.87.{RUN % 16 * 16}.0/20"  # 4,094 addresses: room for --base-pods
NETWORK = f"pycri-chaos-{RUN}"
RPC_TIMEOUT = 60.0
LABEL = "soak-client"
BASE_LABEL = "soak-base"  # the standing pods of --base-pods
EXTRA_BYTES = 8 << 20  # an incompressible layer: pulls of it take long enough to be cut


def conflist(ipam: Path) -> str:
    return json.dumps({
        "cniVersion": "1.0.0", "name": NETWORK,
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(ipam)}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    })


class Interrupted(Exception):
    """The call was cut short by a kill: its effect is unknown."""


class Hang(Exception):
    """A restarted daemon whose socket did not answer Version in time."""


class Gate:
    """Clients run while the gate is open; the killer closes it, kills, restarts, waits
    until every client is parked, checks, and opens it again."""

    def __init__(self, clients: int) -> None:
        self.cond = threading.Condition()
        self.clients = clients
        self.down = False
        self.epoch = 0
        self.parked = 0
        self.stopping = False

    def park(self) -> bool:
        """Wait for the next epoch; False once the soak is ending."""
        with self.cond:
            seen = self.epoch
            self.parked += 1
            self.cond.notify_all()
            while self.epoch == seen and not self.stopping:
                self.cond.wait()
            self.parked -= 1
            return not self.stopping

    def close(self) -> None:
        with self.cond:
            self.down = True

    def wait_parked(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.parked < self.clients:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def open(self) -> None:
        with self.cond:
            self.down = False
            self.epoch += 1
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.down = True
            self.cond.notify_all()


@dataclass
class Pod:
    name: str
    config: pb.PodSandboxConfig
    stopped: bool = False  # StopPodSandbox returned OK
    doubt: bool = False  # a call on it was cut short
    ip: str = ""
    containers: dict[str, Ctr] = field(default_factory=dict)


@dataclass
class Ctr:
    name: str
    long: bool  # sleeps until stopped; the other one exits by itself
    started: bool = False
    stopped: bool = False
    doubt: bool = False


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    ok: Counter[str] = field(default_factory=Counter)
    interrupted: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    losses: list[str] = field(default_factory=list)
    inflight: dict[int, str] = field(default_factory=dict)
    kills_in_rpc: int = 0
    killed_rpcs: Counter[str] = field(default_factory=Counter)
    restart_s: list[float] = field(default_factory=list)  # exec to Version answered
    live_pods: list[int] = field(default_factory=list)  # READY pods listed after each restart
    loadavg: list[float] = field(default_factory=list)  # 1-min load average at each restart
    hangs: list[str] = field(default_factory=list)  # the dump file of each hang
    orphans_removed: int = 0
    crashes: int = 0  # the daemon failed to come up
    seen_ids: set[str] = field(default_factory=set)

    def error(self, msg: str) -> None:
        with self.lock:
            self.errors.append(msg)
        print(f"  ERROR {msg}", flush=True)


class Client(threading.Thread):
    """One kubelet-like client churning its own pods (labelled with its index)."""

    def __init__(self, idx: int, soak: Soak) -> None:
        super().__init__(name=f"client-{idx}", daemon=True)
        self.idx = idx
        self.soak = soak
        self.gate = soak.gate
        self.stats = soak.stats
        self.rng = random.Random(soak.seed * 1000 + idx)
        self.pods: dict[str, Pod] = {}
        self.removed: set[str] = set()  # IDs whose Remove returned OK
        self.seq = 0
        self.cri: CRIClient | None = None

    # -- calls -----------------------------------------------------------------

    def connect(self) -> None:
        if self.cri is not None:
            self.cri.channel.close()
        self.cri = self.soak.proc.client()

    def call(self, kind: str, method: Callable[..., Any], req: Any) -> Any:
        if self.gate.down:
            raise Interrupted(kind)
        self.stats.inflight[self.idx] = kind
        try:
            resp = method(req, timeout=RPC_TIMEOUT)
        except grpc.RpcError as e:
            if self.gate.down:
                with self.stats.lock:
                    self.stats.interrupted[kind] += 1
                raise Interrupted(kind) from None
            self.stats.error(f"client {self.idx} {kind}: {e.code().name} {e.details()}")
            raise
        finally:
            self.stats.inflight.pop(self.idx, None)
        with self.stats.lock:
            self.stats.ok[kind] += 1
        return resp

    @property
    def rt(self) -> Any:
        assert self.cri is not None
        return self.cri.runtime

    @property
    def img(self) -> Any:
        assert self.cri is not None
        return self.cri.image

    # -- the churn ---------------------------------------------------------------

    def run(self) -> None:
        self.connect()
        while not self.gate.stopping:
            try:
                self.step()
            except Interrupted:
                if not self.gate.park():
                    return
                self.connect()
                self.reconcile_until_done()
            except grpc.RpcError:
                time.sleep(0.2)  # counted already; go on churning
            except Exception as e:  # a soak reports failures, it does not stop on them
                self.stats.error(f"client {self.idx}: {type(e).__name__}: {e}")
                time.sleep(0.2)

    def reconcile_until_done(self) -> None:
        """Remove what this client does not know or is unsure of; a kill during this
        parks again and starts over."""
        while not self.gate.stopping:
            try:
                self.reconcile()
                return
            except Interrupted:
                if not self.gate.park():
                    return
                self.connect()

    def step(self) -> None:
        self.reads()
        if len(self.pods) < self.soak.pods_per_client and (
                not self.pods or self.rng.random() < 0.6):
            self.add_pod()
        else:
            sid = self.rng.choice(list(self.pods))
            self.remove_pod(sid)

    def reads(self) -> None:
        r = self.rng.random()
        extra = self.soak.extra_image
        if r < 0.03:
            self.call("PullImage", self.img.PullImage,
                      pb.PullImageRequest(image=pb.ImageSpec(image=self.soak.image)))
        elif r < 0.06 and extra:  # a real download and unpack, so kills land inside
            self.call("PullImage", self.img.PullImage,
                      pb.PullImageRequest(image=pb.ImageSpec(image=extra)))
        elif r < 0.08 and extra:
            self.call("RemoveImage", self.img.RemoveImage,
                      pb.RemoveImageRequest(image=pb.ImageSpec(image=extra)))
        elif r < 0.15:
            self.call("ListImages", self.img.ListImages, pb.ListImagesRequest())
        elif r < 0.25:
            self.call("ImageStatus", self.img.ImageStatus,
                      pb.ImageStatusRequest(image=pb.ImageSpec(image=self.soak.image)))
        self.call("ListPodSandbox", self.rt.ListPodSandbox, pb.ListPodSandboxRequest())
        self.call("ListContainers", self.rt.ListContainers, pb.ListContainersRequest())
        for sid, pod in list(self.pods.items()):
            st = self.call("PodSandboxStatus", self.rt.PodSandboxStatus,
                           pb.PodSandboxStatusRequest(pod_sandbox_id=sid)).status
            if pod.stopped and st.state != pb.SANDBOX_NOTREADY:
                self.stats.error(f"pod {sid[:12]} stopped but {pb.PodSandboxState.Name(st.state)}")
            if not pod.stopped and not pod.doubt:  # its address survives every restart
                pod.ip = pod.ip or st.network.ip
                if st.network.ip != pod.ip:
                    self.stats.error(f"pod {sid[:12]} changed its IP {pod.ip} -> {st.network.ip}")
            for cid in list(pod.containers):
                self.call("ContainerStatus", self.rt.ContainerStatus,
                          pb.ContainerStatusRequest(container_id=cid))

    def add_pod(self) -> None:
        self.seq += 1
        name = f"c{self.idx}-{self.seq}"
        cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace="chaos", uid=f"u-{name}"),
            labels={LABEL: str(self.idx)},
            log_directory=str(self.soak.work / "logs" / name))
        sid = self.call("RunPodSandbox", self.rt.RunPodSandbox,
                        pb.RunPodSandboxRequest(config=cfg)).pod_sandbox_id
        pod = self.pods[sid] = Pod(name, cfg)
        self.stats.seen_ids.add(sid)
        for cname, cmd in (("long", ["sleep", "100000"]), ("short", ["sh", "-c", "exit 3"])):
            if cname == "short" and self.rng.random() < 0.5:
                continue
            ccfg = pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name=cname), labels={LABEL: str(self.idx)},
                image=pb.ImageSpec(image=self.soak.image), command=cmd, log_path=f"{cname}.log")
            cid = self.call("CreateContainer", self.rt.CreateContainer, pb.CreateContainerRequest(
                pod_sandbox_id=sid, config=ccfg, sandbox_config=cfg)).container_id
            ctr = pod.containers[cid] = Ctr(cname, cname == "long")
            self.stats.seen_ids.add(cid)
            self.on(ctr, lambda cid=cid: self.call("StartContainer", self.rt.StartContainer,
                                                   pb.StartContainerRequest(container_id=cid)))
            ctr.started = True
            if ctr.long:
                pause = "sleep 0.3; " if self.rng.random() < 0.3 else ""  # kills land inside
                out = self.call("ExecSync", self.rt.ExecSync, pb.ExecSyncRequest(
                    container_id=cid, cmd=["sh", "-c", f"{pause}echo hi {cid[:8]}"], timeout=20))
                if out.exit_code != 0 or out.stdout != f"hi {cid[:8]}\n".encode():
                    self.stats.error(f"exec in {cid[:12]}: {out.exit_code} {out.stdout!r}")

    def on(self, obj: Pod | Ctr, fn: Callable[[], Any]) -> Any:
        """A call on a known object: cut short, the object is in doubt."""
        try:
            return fn()
        except Interrupted:
            obj.doubt = True
            raise

    def remove_pod(self, sid: str) -> None:
        pod = self.pods[sid]
        for cid, ctr in list(pod.containers.items()):
            if self.rng.random() < 0.5:
                continue  # left to RemovePodSandbox
            self.on(ctr, lambda cid=cid: self.call(
                "StopContainer", self.rt.StopContainer,
                pb.StopContainerRequest(container_id=cid, timeout=0)))
            ctr.stopped = True
            self.on(ctr, lambda cid=cid: self.call(
                "RemoveContainer", self.rt.RemoveContainer,
                pb.RemoveContainerRequest(container_id=cid)))
            del pod.containers[cid]
            self.removed.add(cid)
        self.on(pod, lambda: self.call("StopPodSandbox", self.rt.StopPodSandbox,
                                       pb.StopPodSandboxRequest(pod_sandbox_id=sid)))
        pod.stopped = True
        for ctr in pod.containers.values():
            ctr.stopped = True
        self.on(pod, lambda: self.call("RemovePodSandbox", self.rt.RemovePodSandbox,
                                       pb.RemovePodSandboxRequest(pod_sandbox_id=sid)))
        del self.pods[sid]
        self.removed.add(sid)
        self.removed.update(pod.containers)

    def reconcile(self) -> None:
        """After a restart: every listed object of this client that it does not know, or
        that a cut-short call left in doubt, is stopped and removed (it must be)."""
        mine = {LABEL: str(self.idx)}
        pods = self.call("ListPodSandbox", self.rt.ListPodSandbox, pb.ListPodSandboxRequest(
            filter=pb.PodSandboxFilter(label_selector=mine))).items
        ctrs = self.call("ListContainers", self.rt.ListContainers, pb.ListContainersRequest(
            filter=pb.ContainerFilter(label_selector=mine))).containers
        self.stats.seen_ids.update(p.id for p in pods)
        self.stats.seen_ids.update(c.id for c in ctrs)
        doomed_pods = [p.id for p in pods if p.id not in self.pods or self.pods[p.id].doubt]
        known_ctrs = {cid: ctr for pod in self.pods.values() for cid, ctr in pod.containers.items()}
        for c in ctrs:
            if c.pod_sandbox_id in doomed_pods:
                continue
            ctr = known_ctrs.get(c.id)
            if ctr is None or ctr.doubt:
                self.call("StopContainer", self.rt.StopContainer,
                          pb.StopContainerRequest(container_id=c.id, timeout=0))
                self.call("RemoveContainer", self.rt.RemoveContainer,
                          pb.RemoveContainerRequest(container_id=c.id))
                self.forget(c.id)
                self.stats.orphans_removed += 1
        listed_ctrs = {c.id for c in ctrs}
        for pod in self.pods.values():  # a doubtful remove that had finished
            for cid in [cid for cid, ctr in pod.containers.items()
                        if ctr.doubt and cid not in listed_ctrs]:
                del pod.containers[cid]
        for sid in doomed_pods:
            self.call("StopPodSandbox", self.rt.StopPodSandbox,
                      pb.StopPodSandboxRequest(pod_sandbox_id=sid))
            self.call("RemovePodSandbox", self.rt.RemovePodSandbox,
                      pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
            self.forget(sid)
            self.stats.orphans_removed += 1
        listed = {p.id for p in pods}
        for sid in [s for s, p in self.pods.items() if p.doubt and s not in listed]:
            self.forget(sid)

    def forget(self, oid: str) -> None:
        pod = self.pods.pop(oid, None)
        if pod is not None:
            self.removed.update(pod.containers)
        for p in self.pods.values():
            p.containers.pop(oid, None)
        self.removed.add(oid)

    # -- the invariant -------------------------------------------------------------

    def check(self, pods: dict[str, int], ctrs: dict[str, int]) -> list[str]:
        """What this client was told against what the restarted daemon lists."""
        bad = []
        for sid, pod in self.pods.items():
            state = pods.get(sid)
            if state is None:
                if not pod.doubt:
                    bad.append(f"pod {sid[:12]} ({pod.name}) was created but is gone")
                continue
            if pod.stopped and not pod.doubt and state != pb.SANDBOX_NOTREADY:
                bad.append(f"pod {sid[:12]} was stopped but is {pb.PodSandboxState.Name(state)}")
            if not pod.stopped and not pod.doubt and state != pb.SANDBOX_READY:
                bad.append(f"pod {sid[:12]} is {pb.PodSandboxState.Name(state)}, never stopped")
            for cid, ctr in pod.containers.items():
                cstate = ctrs.get(cid)
                if cstate is None:
                    if not ctr.doubt and not pod.doubt:
                        bad.append(f"container {cid[:12]} ({pod.name}/{ctr.name}) is gone")
                    continue
                if ctr.doubt or pod.doubt:
                    continue
                want = ({pb.CONTAINER_EXITED} if ctr.stopped or (ctr.started and not ctr.long)
                        else {pb.CONTAINER_RUNNING} if ctr.started
                        else {pb.CONTAINER_CREATED})
                if ctr.started and not ctr.long:
                    want.add(pb.CONTAINER_RUNNING)  # `exit 3` may not have exited yet
                if cstate not in want:
                    bad.append(f"container {cid[:12]} ({pod.name}/{ctr.name}) is "
                               f"{pb.ContainerState.Name(cstate)}, expected "
                               f"{[pb.ContainerState.Name(s) for s in want]}")
        back = self.removed & (set(pods) | set(ctrs))
        bad += [f"removed {oid[:12]} is back" for oid in back]
        return bad


class Soak:
    def __init__(self, work: Path, image: str, extra_image: str | None,
                 args: argparse.Namespace) -> None:
        self.work = work
        self.image = image
        self.extra_image = extra_image
        self.seed = args.seed
        self.pods_per_client = args.pods_per_client
        net_d = work / "net.d"
        net_d.mkdir(parents=True)
        (net_d / "10-chaos.conflist").write_text(conflist(work / "ipam"))
        config = work / "pycri.toml"
        # cAdvisor's default path is the host's: a private daemon never links it.
        config.write_text('[cadvisor]\ndefault_path = ""\n'
                          f'[cni]\nconf_dir = "{net_d}"\ndefault_network = false\n'
                          f'[nri]\nsocket_path = "{work / "nri.sock"}"\n'
                          f'plugin_path = "{work / "nri-plugins"}"\n')
        self.proc = PycriProcess(root=work / "root", state=work / "state",
                                 socket=work / "state" / "pycri.sock", config=config,
                                 log=work / "pycri.log")
        self.gate = Gate(args.clients)
        self.stats = Stats()
        self.clients = [Client(i, self) for i in range(args.clients)]
        self.hang_after = args.hang_after
        self.base: dict[str, str] = {}  # standing pod ID -> its container's ID

    def parallel(self, fn: Callable[[CRIClient, Any], None], items: Iterable[Any],
                 workers: int) -> None:
        """fn(client, item) for every item, `workers` at a time, each with its own channel."""
        local = threading.local()
        channels: list[grpc.Channel] = []

        def run(item: Any) -> None:
            if not hasattr(local, "cri"):
                local.cri = self.proc.client()
                channels.append(local.cri.channel)
            fn(local.cri, item)

        try:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(run, items))
        finally:
            for ch in channels:
                ch.close()

    def add_base_pods(self, n: int, workers: int) -> None:
        """The node's standing load: n pods with one long-running container each."""
        lock = threading.Lock()

        def one(cri: CRIClient, i: int) -> None:
            name = f"base-{i}"
            cfg = pb.PodSandboxConfig(
                metadata=pb.PodSandboxMetadata(name=name, namespace="chaos", uid=f"u-{name}"),
                labels={BASE_LABEL: "1"}, log_directory=str(self.work / "logs" / name))
            sid = cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg),
                                            timeout=RPC_TIMEOUT).pod_sandbox_id
            ccfg = pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name="sleep"), labels={BASE_LABEL: "1"},
                image=pb.ImageSpec(image=self.image), command=["sleep", "100000"],
                log_path="sleep.log")
            cid = cri.runtime.CreateContainer(pb.CreateContainerRequest(
                pod_sandbox_id=sid, config=ccfg, sandbox_config=cfg),
                timeout=RPC_TIMEOUT).container_id
            cri.runtime.StartContainer(pb.StartContainerRequest(container_id=cid),
                                       timeout=RPC_TIMEOUT)
            with lock:
                self.base[sid] = cid
                self.stats.seen_ids.update((sid, cid))
                if len(self.base) % 50 == 0:
                    print(f"  {len(self.base)} standing pods", flush=True)

        self.parallel(one, range(n), workers)

    def kill_and_restart(self) -> None:
        self.gate.close()
        inflight = list(self.stats.inflight.values())
        assert self.proc.proc is not None
        self.proc.kill()  # SIGKILL by pid, then wait
        if inflight:
            self.stats.kills_in_rpc += 1
            self.stats.killed_rpcs.update(inflight)
        # The dead daemon's socket file would make the readiness probe back off for a
        # second; the daemon removes a stale socket itself, so this only speeds the probe.
        self.proc.socket.unlink(missing_ok=True)
        self.stats.restart_s.append(self.start())
        self.stats.loadavg.append(os.getloadavg()[0])
        if not self.gate.wait_parked(RPC_TIMEOUT * 2):
            self.stats.error("clients did not park within the deadline after a kill")
        self.check()
        self.gate.open()

    def start(self, bound: float | None = None) -> float:
        """Start the daemon; returns the seconds from exec until Version answered. A daemon
        that exits first is a crash: counted, its log tail shown, and tried twice more. One
        that does not answer within `bound` (--hang-after) is a hang: dumped, then Hang."""
        bound = bound or self.hang_after
        for attempt in range(3):
            t0 = time.monotonic()
            with open(self.proc.log, "ab") as log:
                self.proc.proc = subprocess.Popen(self.proc.argv(), stdout=log,
                                                  stderr=subprocess.STDOUT)
            while self.proc.proc.poll() is None:
                if self.answers_version():
                    return time.monotonic() - t0
                if time.monotonic() - t0 > bound:
                    raise Hang(self.dump_hang(time.monotonic() - t0))
                time.sleep(0.02)
            tail = "\n".join(self.proc.log_text().splitlines()[-15:])
            self.stats.error(f"the daemon exited {self.proc.proc.returncode} at start "
                             f"(attempt {attempt + 1}):\n{tail}")
            self.stats.crashes += 1
        raise SystemExit("the daemon does not start any more; giving up")

    def answers_version(self) -> bool:
        if not self.proc.socket.exists():
            return False
        cri = self.proc.client()
        try:
            cri.runtime.Version(pb.VersionRequest(), timeout=1.0)
            return True
        except grpc.RpcError:
            return False
        finally:
            cri.channel.close()

    def dump_hang(self, waited: float) -> str:
        """py-spy's native stacks of the stuck daemon and its log tail, in a file."""
        assert self.proc.proc is not None
        out = self.work / f"hang-{len(self.stats.hangs) + 1}.txt"
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        try:
            dump = subprocess.run([spy, "dump", "--native", "--pid", str(self.proc.proc.pid)],
                                  capture_output=True, text=True, timeout=120)
            stacks = dump.stdout + dump.stderr
        except (OSError, subprocess.TimeoutExpired) as e:
            stacks = f"py-spy failed: {e}"
        tail = "\n".join(self.proc.log_text().splitlines()[-300:])
        out.write_text(f"pid {self.proc.proc.pid}: no Version answer after {waited:.1f}s "
                       f"(load {os.getloadavg()})\n\n{stacks}\n--- log tail ---\n{tail}\n")
        self.stats.hangs.append(str(out))
        print(f"  HANG after {waited:.1f}s: {out}", flush=True)
        return str(out)

    def check(self) -> None:
        """Every client's ledger against what the restarted daemon lists."""
        pods, ctrs, owners = self.listing()
        self.stats.seen_ids.update(pods)
        self.stats.seen_ids.update(ctrs)
        bad = [f"container {cid[:12]} is in pod {sid[:12]}, which is gone"
               for cid, sid in owners.items() if sid not in pods]
        self.stats.live_pods.append(sum(s == pb.SANDBOX_READY for s in pods.values()))
        for sid, cid in self.base.items():
            if pods.get(sid) != pb.SANDBOX_READY or ctrs.get(cid) != pb.CONTAINER_RUNNING:
                bad.append(f"standing pod {sid[:12]} is {pods.get(sid)}, its container "
                           f"{ctrs.get(cid)}")
        for client in self.clients:
            bad += client.check(pods, ctrs)
        for msg in bad:
            self.stats.losses.append(msg)
            print(f"  LOSS {msg}", flush=True)

    def listing(self) -> tuple[dict[str, int], dict[str, int], dict[str, str]]:
        """Pod states, container states and each container's pod, as the daemon lists them."""
        cri = self.proc.client()
        try:
            pods = {p.id: p.state for p in cri.runtime.ListPodSandbox(
                pb.ListPodSandboxRequest(), timeout=RPC_TIMEOUT).items}
            listed = cri.runtime.ListContainers(pb.ListContainersRequest(),
                                                timeout=RPC_TIMEOUT).containers
        finally:
            cri.channel.close()
        return (pods, {c.id: c.state for c in listed},
                {c.id: c.pod_sandbox_id for c in listed})

    def remove_all(self) -> None:
        cri = self.proc.client()
        try:
            pods = cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
            self.stats.seen_ids.update(p.id for p in pods)
            self.parallel(remove_pod, [p.id for p in pods], len(self.clients))
            if self.extra_image:  # its blobs and layers must all go
                cri.image.RemoveImage(pb.RemoveImageRequest(
                    image=pb.ImageSpec(image=self.extra_image)), timeout=RPC_TIMEOUT)
            left = cri.runtime.ListContainers(pb.ListContainersRequest()).containers
            for c in left:
                self.stats.error(f"container {c.id[:12]} outlived its pod")
                cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=c.id))
        finally:
            cri.channel.close()


def remove_pod(cri: CRIClient, sid: str) -> None:
    cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=RPC_TIMEOUT)
    cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid),
                                 timeout=RPC_TIMEOUT)


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of xs (nearest rank)."""
    r = sorted(xs) or [0.0]
    return round(r[max(0, min(len(r) - 1, int(len(r) * q + 0.5) - 1))], 3)


def summary(soak: Soak, kills: int, seconds: float, left: dict[str, list[str]]) -> dict[str, Any]:
    st = soak.stats
    return {
        "kills": kills,
        "kills_inside_rpcs": st.kills_in_rpc,
        "seconds": round(seconds, 1),
        "clients": len(soak.clients),
        "rpcs_ok": dict(sorted(st.ok.items())),
        "rpcs_ok_total": sum(st.ok.values()),
        "rpcs_cut_short": dict(sorted(st.interrupted.items())),
        "rpcs_in_flight_at_kills": dict(sorted(st.killed_rpcs.items())),
        "restart_seconds": {"median": pct(st.restart_s, 0.5), "p95": pct(st.restart_s, 0.95),
                            "p99": pct(st.restart_s, 0.99), "max": pct(st.restart_s, 1.0)},
        "standing_pods": len(soak.base),
        "live_pods": {"min": min(st.live_pods, default=0), "max": max(st.live_pods, default=0)},
        "loadavg_1min": {"min": min(st.loadavg, default=0.0), "median": pct(st.loadavg, 0.5),
                         "max": max(st.loadavg, default=0.0)},
        "hangs": st.hangs,
        "orphans_removed": st.orphans_removed,
        "daemon_start_failures": st.crashes,
        "losses": len(st.losses),
        "errors": len(st.errors),
        "leaks": sum(len(v) for v in left.values()),
        "leftovers": left,
    }


def cleanup(work: Path) -> int:
    """Restart the daemon of an interrupted soak on its own dirs and remove everything."""
    proc = PycriProcess(root=work / "root", state=work / "state",
                        socket=work / "state" / "pycri.sock", config=work / "pycri.toml",
                        log=work / "pycri.log")
    proc.socket.unlink(missing_ok=True)
    proc.start()
    cri = proc.client()
    try:
        for p in cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items:
            remove_pod(cri, p.id)
    finally:
        cri.channel.close()
        proc.stop()
    net = json.loads((work / "net.d" / "10-chaos.conflist").read_text())
    left = leftovers(work, set(), net["name"])
    subprocess.run(["ip", "link", "del", net["plugins"][0]["bridge"]], capture_output=True)
    print(json.dumps(left, indent=2))
    return 1 if any(left.values()) else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--image", help="a busybox image the daemon can pull (default: push the "
                    "test busybox to a private loopback registry)")
    ap.add_argument("--kills", type=int, default=50, help="stop after this many kill -9s")
    ap.add_argument("--minutes", type=float, default=60.0, help="…or after this long")
    ap.add_argument("--clients", type=int, default=4, help="parallel churning clients")
    ap.add_argument("--pods-per-client", type=int, default=2)
    ap.add_argument("--base-pods", type=int, default=0,
                    help="standing pods (one long-running container each) kept all along")
    ap.add_argument("--hang-after", type=float, default=30.0, metavar="S",
                    help="a restart whose socket does not answer Version by then is a hang")
    ap.add_argument("--gap", type=float, nargs=2, default=(0.2, 1.0), metavar=("MIN", "MAX"),
                    help="seconds between kills (uniform)")
    ap.add_argument("--long-gap", type=float, nargs=2, default=(1.5, 4.0), metavar=("MIN", "MAX"),
                    help="…for this share of the kills, so slow calls (RunPodSandbox under "
                    "load) finish too")
    ap.add_argument("--long-share", type=float, default=0.35)
    ap.add_argument("--pace", action="store_true",
                    help="spread the other kills over --minutes: each gap is uniform around "
                    "the mean that fits the kills left into the time left (less what a restart "
                    "and its check took so far), the mean kept within --gap")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the summary here")
    ap.add_argument("--keep", action="store_true", help="keep the work dir even if clean")
    ap.add_argument("--cleanup", type=Path, metavar="WORK_DIR",
                    help="only remove what an interrupted soak left in WORK_DIR, then report")
    args = ap.parse_args()
    if args.cleanup:
        return cleanup(args.cleanup)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="pycri-chaos-", dir="/var/tmp"))
    registry = None
    image, extra = args.image, None
    if image is None:
        registry = Registry(work / "registry")
        registry.start()
        image = images.push_busybox(registry.addr, work / "layout")
        noise = images.file("noise", random.Random(args.seed).randbytes(EXTRA_BYTES))
        extra = images.push_image(registry.addr, work / "layout-extra", "chaos-extra", "1",
                                  [images.ImageSpec(layers=[[noise]])])
    soak = Soak(work, image, extra, args)
    print(f"work dir {work}, image {image}", flush=True)
    stop = threading.Event()  # SIGTERM ends the run early, cleanly: remove all, count
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    kills = 0
    left: dict[str, list[str]] = {}
    try:
        soak.start(bound=120.0)  # the first start, on an empty node, is not a restart
        cri = soak.proc.client()
        cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=image)))
        cri.channel.close()
        if args.base_pods:
            t_base = time.monotonic()
            soak.add_base_pods(args.base_pods, args.clients)
            print(f"{args.base_pods} standing pods in {time.monotonic() - t_base:.0f}s",
                  flush=True)
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        for c in soak.clients:
            c.start()
        slept = 0.0
        while kills < args.kills and time.monotonic() < end and not stop.is_set():
            if rng.random() < args.long_share:  # slow calls (RunPodSandbox) finish too
                gap = rng.uniform(*args.long_gap)
            elif args.pace:
                overhead = (time.monotonic() - t0 - slept) / kills if kills else 2.0
                mean = (end - time.monotonic()) / (args.kills - kills) - overhead
                mean = min(max(mean, args.gap[0]), args.gap[1])
                gap = rng.uniform(0.5 * mean, 1.5 * mean)
            else:
                gap = rng.uniform(*args.gap)
            time.sleep(gap)
            slept += gap
            kills += 1
            try:
                soak.kill_and_restart()
            except Hang:
                break
            if kills % 25 == 0:
                st = soak.stats
                print(f"{kills} kills, {time.monotonic() - t0:.0f}s, {sum(st.ok.values())} "
                      f"RPCs ok, {st.kills_in_rpc} kills inside RPCs, losses "
                      f"{len(st.losses)}, errors {len(st.errors)}, restart median "
                      f"{statistics.median(st.restart_s):.2f}s max {max(st.restart_s):.2f}s, "
                      f"live pods {st.live_pods[-1]}, load {st.loadavg[-1]:.1f}", flush=True)
        soak.gate.stop()
        for c in soak.clients:
            c.join(RPC_TIMEOUT * 2)
        seconds = time.monotonic() - t0
        if soak.stats.hangs:  # dumped already: kill the stuck daemon, start one to clean up
            soak.proc.kill()
            soak.proc.socket.unlink(missing_ok=True)
            soak.start(bound=600.0)
        soak.remove_all()
    finally:
        soak.proc.stop()
        left = leftovers(work, soak.stats.seen_ids, NETWORK)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
        if registry is not None:
            registry.stop()
    result = summary(soak, kills, seconds, left)
    print(json.dumps(result, indent=2), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    bad = result["leaks"] or result["losses"] or result["errors"] or result["hangs"]
    if not bad and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
