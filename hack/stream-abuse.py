#!/usr/bin/env python3
"""Streaming abuse, bigger than CI: the attacks of tests/streaming/test_abuse.py with
counts you choose, against a pycri you started (loopback only).

For each attack it prints the daemon's VmRSS and open fds before, during and after,
whether the attacked session was closed, and how long the CRI socket took to answer
Version meanwhile; exit status 1 if a bound given on the command line was passed or
Version did not answer within 5 s.

    hack/stream-abuse.py --socket /run/pycri/pycri.sock --pid $(cat /run/pycri/pycri.pid) \\
        --container <running container id> [--pod <host-network pod id>] --syn 200000
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from pycri.api import api_pb2 as pb
from tests.conftest import CRIClient
from tests.streaming import abuse

CHANNELS = ["error", "stdout"]


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cri = CRIClient(grpc.insecure_channel(f"unix://{args.socket}"))
        self.failed = False
        self.base = abuse.usage(args.pid)

    def version_seconds(self) -> float:
        start = time.monotonic()
        try:
            self.cri.runtime.Version(pb.VersionRequest(), timeout=5)
        except grpc.RpcError as e:
            print(f"  Version failed: {e.code()}")
            self.failed = True
        return time.monotonic() - start

    def report(self, name: str, closed: bool | None, during: abuse.Usage) -> None:
        after = abuse.usage(self.args.pid)
        v = self.version_seconds()
        rss = max(during.rss_kib, after.rss_kib) - self.base.rss_kib
        fds = max(during.fds, after.fds) - self.base.fds
        bad = rss > self.args.max_rss_mib * 1024 or fds > self.args.max_extra_fds
        self.failed |= bad
        print(f"{name:28} rss +{rss / 1024:7.1f} MiB  fds +{fds:5d}  session closed: "
              f"{closed}  Version {v * 1000:.0f} ms{'  OVER BOUND' if bad else ''}")

    def exec_url(self) -> str:
        return self.cri.runtime.Exec(pb.ExecRequest(container_id=self.args.container,
                                                    cmd=["sleep", "60"], stdout=True)).url

    async def syn(self, fin: bool) -> None:
        raw = await abuse.syn_flood(self.exec_url(), self.args.syn, fin=fin, unidirectional=fin,
                                    channels=CHANNELS)
        during = abuse.usage(self.args.pid)
        closed = await raw.wait_closed(30)
        await raw.close()
        self.report(f"SYN flood fin={fin}", closed, during)

    async def data(self) -> None:
        raw, sent = await abuse.data_flood(self.exec_url(), self.args.data_streams,
                                           self.args.data_frames, 1 << 20, channels=CHANNELS,
                                           budget=30)
        during = abuse.usage(self.args.pid)
        await raw.close()
        print(f"  data flood: daemon took {sent >> 20} MiB of "
              f"{self.args.data_streams * self.args.data_frames} MiB offered")
        self.report("data flood", None, during)

    def idle(self) -> None:
        host, port = abuse.host_port(self.exec_url())
        socks = abuse.idle_flood(host, port, self.args.idle)
        time.sleep(2)
        during = abuse.usage(self.args.pid)
        v = self.version_seconds()
        print(f"  Version during the idle flood: {v * 1000:.0f} ms")
        for s in socks:
            s.close()
        self.report(f"{self.args.idle} idle connections", None, during)

    async def slow(self) -> None:
        took = await abuse.dribble(self.exec_url(), 0.5, limit=60)
        print(f"  slowloris head cut off after {took} s")
        raw = await abuse.upgrade(self.exec_url(), ["v4.channel.k8s.io"])
        closed = await raw.wait_closed(60)
        await raw.close()
        self.report("slowloris + half-open", closed, abuse.usage(self.args.pid))

    async def pairs(self, port: int) -> None:
        url = self.cri.runtime.PortForward(
            pb.PortForwardRequest(pod_sandbox_id=self.args.pod)).url
        raw = await abuse.pair_flood(url, port, self.args.pairs)
        await asyncio.sleep(3)
        during = abuse.usage(self.args.pid)
        await raw.close()
        self.report(f"{self.args.pairs} port-forward pairs", None, during)


def hold_connections() -> int:
    """A host-loopback server that never closes what it accepts (for a host-network pod)."""
    lsock = socket.create_server(("127.0.0.1", 0), backlog=4096)
    held = []

    def loop() -> None:
        while True:
            held.append(lsock.accept()[0])

    threading.Thread(target=loop, daemon=True).start()
    return int(lsock.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True, help="the CRI socket")
    ap.add_argument("--pid", type=int, required=True, help="the daemon's pid (for /proc)")
    ap.add_argument("--container", required=True, help="a running container to exec in")
    ap.add_argument("--pod", help="a host-network pod for the port-forward flood")
    ap.add_argument("--syn", type=int, default=200_000)
    ap.add_argument("--data-streams", type=int, default=20)
    ap.add_argument("--data-frames", type=int, default=31)
    ap.add_argument("--idle", type=int, default=20_000)
    ap.add_argument("--pairs", type=int, default=1500)
    ap.add_argument("--max-rss-mib", type=float, default=200)
    ap.add_argument("--max-extra-fds", type=int, default=300)
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    run = Run(args)
    print(f"daemon at start: rss {run.base.rss_kib / 1024:.1f} MiB, {run.base.fds} fds")
    asyncio.run(run.syn(True))
    asyncio.run(run.syn(False))
    asyncio.run(run.data())
    run.idle()
    asyncio.run(run.slow())
    if args.pod:
        asyncio.run(run.pairs(hold_connections()))
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
