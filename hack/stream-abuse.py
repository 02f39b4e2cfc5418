#!/usr/bin/env python3
"""Streaming abuse, bigger than CI: the attacks of tests/streaming/test_abuse.py with
counts you choose, against a pycri you started (loopback only).

For each attack it prints the daemon's VmRSS and open fds before, during and after,
whether the attacked session was closed, and how long the CRI socket took to answer
Version meanwhile; exit status 1 if a bound given on the command line was passed or
Version did not answer within 5 s.

    hack/stream-abuse.py --socket /run/pycri/pycri.sock --pid $(cat /run/pycri/pycri.pid) \\
        --container <running container id> [--pod <host-network pod id>] --syn 200000

The tiny-message and ping floods (issue 22, part 5) run `--flooders` connections at once,
over WebSocket and SPDY, and print Version's p99 while they last.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import resource
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from pycri.api import api_pb2 as pb
from pycri.streaming import spdy
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

    def exec_url(self, cmd: tuple[str, ...] = ("sleep", "60")) -> str:
        return self.cri.runtime.Exec(pb.ExecRequest(container_id=self.args.container,
                                                    cmd=list(cmd), stdin=True,
                                                    stdout=True)).url  # fmt: skip

    def version_p99(self, calls: int = 100) -> float:
        took = sorted(self.version_seconds() for _ in range(calls))
        return took[math.ceil(0.99 * calls) - 1]

    async def flood_connection(self, transport: str, frame: str, cmd: tuple[str, ...]
                               ) -> abuse.Flood:  # fmt: skip
        """An exec connection and the unit it floods with: a tiny stdin message or a ping."""
        url = self.exec_url(cmd)
        if transport == "websocket":
            ws = await abuse.upgrade_ws(url, ["v5.channel.k8s.io"])
            unit = (abuse.ws_frame(abuse.WS_PING) if frame == "ping"
                    else abuse.ws_frame(abuse.WS_BINARY, b"\0xy"))  # fmt: skip
            return abuse.Flood(ws, unit)
        raw = await abuse.upgrade(url, ["v4.channel.k8s.io"])
        await abuse.open_channels(raw, ["error", "stdin", "stdout"])
        unit = raw.codec.encode(spdy.Ping(1) if frame == "ping" else spdy.DataFrame(3, b"xy"))
        return abuse.Flood(raw, unit)

    async def tiny(self, transport: str, frame: str, cmd: tuple[str, ...]) -> None:
        """`--flooders` connections sending `--tiny` frames each: Version's p99 while they
        go on, and what the daemon holds once it stopped taking them."""
        floods = [await self.flood_connection(transport, frame, cmd)
                  for _ in range(self.args.flooders)]  # fmt: skip
        tasks = [asyncio.create_task(f.run(self.args.tiny)) for f in floods]
        p99 = await asyncio.to_thread(self.version_p99)
        await abuse.taken(self.args.pid, floods, 120)
        during = abuse.usage(self.args.pid)
        closed = all(f.raw.closed.is_set() for f in floods)
        for t in tasks:
            t.cancel()
        for f in floods:
            await f.raw.abort()
        name = f"{transport} {frame} to {cmd[-1].split()[0]} x{self.args.flooders}"
        print(f"  {name}: Version p99 {p99 * 1000:.0f} ms meanwhile; "
              f"taken {[f.sent for f in floods]}")
        self.failed |= p99 > 0.1
        self.report(name, closed, during)

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
    ap.add_argument("--tiny", type=int, default=600_000, help="frames per flooding connection")
    ap.add_argument("--flooders", type=int, default=3)
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
    for transport in ("websocket", "spdy"):
        asyncio.run(run.tiny(transport, "data", ("sleep", "60")))  # stdin never read
        asyncio.run(run.tiny(transport, "data", ("sh", "-c", "cat >/dev/null")))
        asyncio.run(run.tiny(transport, "ping", ("sleep", "60")))
    if args.pod:
        asyncio.run(run.pairs(hold_connections()))
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
