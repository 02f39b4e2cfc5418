#!/usr/bin/env python3
"""Soak: churn pods and containers while pycri is killed and restarted, then count leaks.

Not a test (it runs for minutes). It starts its own `pycri serve` on a private
root/state/socket and CNI network, then for `--minutes`:
  - keeps up to `--pods` pods, each with a long-running container and a
    container that exits, created and torn down at random;
  - every `--kill-every` seconds kills the daemon with SIGKILL (or SIGTERM),
    restarts it, and checks that every pod and container it had comes back.
At the end it removes everything and prints what was left on the host
(netns, mounts, conmon processes, cgroups, IP leases); exit status 1 if any.

    .venv/bin/python hack/soak.py --image 127.0.0.1:5000/e2e-test-images/busybox:1.29-2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pycri.api import api_pb2 as pb
from pycri.api.api_pb2_grpc import RuntimeServiceStub
from tests.conftest import CRIClient, PycriProcess

BRIDGE = "soak0"
SUBNET = "10.86.0.0/16"


def conflist(ipam: Path) -> str:
    return json.dumps({
        "cniVersion": "1.0.0", "name": "soak",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(ipam)}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    })


class Soak:
    def __init__(self, work: Path, image: str) -> None:
        self.work = work
        self.image = image
        net_d = work / "net.d"
        net_d.mkdir(parents=True)
        (net_d / "10-soak.conflist").write_text(conflist(work / "ipam"))
        config = work / "pycri.toml"
        config.write_text(f'[cni]\nconf_dir = "{net_d}"\ndefault_network = false\n')
        self.proc = PycriProcess(root=work / "root", state=work / "state",
                                 socket=work / "state" / "pycri.sock", config=config,
                                 log=work / "pycri.log")
        self.cri: CRIClient | None = None
        self.seq = 0
        self.stats = {"pods": 0, "containers": 0, "restarts": 0, "errors": 0}
        self.ids: set[str] = set()

    @property
    def rt(self) -> RuntimeServiceStub:
        assert self.cri is not None
        return self.cri.runtime

    def start(self) -> None:
        self.proc.start()
        self.cri = self.proc.client()

    def restart(self, sig: int) -> None:
        before = self.snapshot()
        assert self.cri is not None
        self.cri.channel.close()
        if sig == signal.SIGKILL:
            self.proc.kill()
        else:
            self.proc.stop(sig)
        self.start()
        after = self.snapshot()
        lost = {k: v for k, v in before.items() if after.get(k) not in (v, pb.CONTAINER_EXITED)}
        if lost:
            print(f"  restart lost or changed state of {len(lost)} objects: {lost}")
            self.stats["errors"] += len(lost)
        self.stats["restarts"] += 1

    def snapshot(self) -> dict[str, int]:
        pods = {p.id: p.state for p in self.rt.ListPodSandbox(pb.ListPodSandboxRequest()).items}
        ctrs = {c.id: c.state for c in
                self.rt.ListContainers(pb.ListContainersRequest()).containers}
        return pods | ctrs

    def add_pod(self) -> None:
        self.seq += 1
        name = f"soak-{self.seq}"
        cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace="soak", uid=f"u-{name}"),
            log_directory=str(self.work / "logs" / name))
        sid = self.rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg)).pod_sandbox_id
        self.ids.add(sid)
        for cname, cmd in (("long", ["sleep", "100000"]), ("short", ["sh", "-c", "exit 3"])):
            ccfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=cname),
                                      image=pb.ImageSpec(image=self.image), command=cmd,
                                      log_path=f"{cname}.log")
            cid = self.rt.CreateContainer(pb.CreateContainerRequest(
                pod_sandbox_id=sid, config=ccfg, sandbox_config=cfg)).container_id
            self.ids.add(cid)
            self.rt.StartContainer(pb.StartContainerRequest(container_id=cid))
            self.stats["containers"] += 1
        self.stats["pods"] += 1

    def remove_pod(self, sid: str) -> None:
        self.rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
        self.rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))

    def remove_all(self) -> None:
        for p in self.rt.ListPodSandbox(pb.ListPodSandboxRequest()).items:
            self.remove_pod(p.id)

    def leftovers(self) -> dict[str, list[str]]:
        netns = [n for n in os.listdir("/run/netns") if n.removeprefix("pycri-") in self.ids]
        mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()
                  if str(self.work) in ln]
        conmon = subprocess.run(["pgrep", "-f", f"conmon.*{self.work}"], capture_output=True,
                                text=True).stdout.split()
        cgroups = [str(d) for i in self.ids for d in
                   Path("/sys/fs/cgroup").glob(f"*/pycri/pycri-{i}")]
        leases = [p.name for p in (self.work / "ipam").rglob("*") if p.name[:1].isdigit()]
        return {"netns": netns, "mounts": mounts, "conmon": conmon, "cgroups": cgroups,
                "leases": leases}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--image", required=True, help="a busybox image the daemon can pull")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--pods", type=int, default=10, help="pods alive at most")
    ap.add_argument("--kill-every", type=float, default=30.0, help="seconds between kills")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    random.seed(args.seed)
    work = Path(tempfile.mkdtemp(prefix="pycri-soak-", dir="/var/tmp"))
    soak = Soak(work, args.image)
    soak.start()
    soak.rt  # noqa: B018 - fail early if the daemon is not reachable
    assert soak.cri is not None
    soak.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=args.image)))
    end = time.monotonic() + args.minutes * 60
    next_kill = time.monotonic() + args.kill_every
    try:
        while time.monotonic() < end:
            pods = [p.id for p in soak.rt.ListPodSandbox(pb.ListPodSandboxRequest()).items]
            try:
                if len(pods) < args.pods and (not pods or random.random() < 0.6):
                    soak.add_pod()
                else:
                    soak.remove_pod(random.choice(pods))
            except Exception as e:  # a soak reports failures, it does not stop on them
                soak.stats["errors"] += 1
                print(f"  error: {e}")
            if time.monotonic() >= next_kill:
                sig = random.choice([signal.SIGKILL, signal.SIGTERM])
                print(f"restart #{soak.stats['restarts'] + 1} with {signal.Signals(sig).name}")
                soak.restart(sig)
                next_kill = time.monotonic() + args.kill_every
        soak.remove_all()
        left = soak.leftovers()
    finally:
        if soak.cri is not None:
            soak.cri.channel.close()
        soak.proc.stop()
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
    print(json.dumps({"stats": soak.stats, "leftovers": left}, indent=2))
    leaked = any(left.values())
    if not leaked:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if leaked or soak.stats["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
