#!/usr/bin/env python3
"""What the socket-activation relay costs (issue 13): Version latency and raw throughput.

Starts `pycri serve` twice in a temporary root/state (as root): once on its own
socket, once handed a listening socket as fd 3 the way systemd passes it, and times
N Version calls on one connection each way; then pushes bytes through a
`SocketProxy` to a sink to show its ceiling. Run with the venv, from the repository:
    hack/bench-activation.py [--calls 2000] [--mbytes 256]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc as pb_grpc
from pycri.sockproxy import SocketProxy

# Puts fd argv[1] at 3 and LISTEN_PID at our pid, then execs the rest (what systemd does).
ACTIVATE = (
    "import os, sys; fd = int(sys.argv[1]); os.dup2(fd, 3); fd != 3 and os.close(fd); "
    "os.environ['LISTEN_PID'] = str(os.getpid()); os.execv(sys.argv[2], sys.argv[2:])"
)


def latency(target: str, calls: int) -> str:
    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.RuntimeServiceStub(ch)
        stub.Version(pb.VersionRequest(), wait_for_ready=True, timeout=60)
        took = []
        for _ in range(calls):
            start = time.perf_counter()
            stub.Version(pb.VersionRequest(), timeout=10)
            took.append(time.perf_counter() - start)
    took.sort()
    return f"p50 {took[calls // 2] * 1e6:.0f} us, p99 {took[int(calls * 0.99)] * 1e6:.0f} us"


async def throughput(tmp: Path, total: int) -> float:
    """MB/s through the relay on one connection, into a sink that counts."""

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(1 << 18):
            pass
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    upstream = tmp / "sink.sock"
    server = await asyncio.start_unix_server(sink, str(upstream))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp / "relay.sock"))
    listener.listen(4)
    proxy = SocketProxy(listener, upstream)
    await proxy.start()

    def client() -> float:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(str(tmp / "relay.sock"))
            buf = b"x" * (1 << 20)
            start = time.perf_counter()
            for _ in range(total >> 20):
                c.sendall(buf)
            c.shutdown(socket.SHUT_WR)
            c.recv(2)
            return time.perf_counter() - start

    took = await asyncio.to_thread(client)
    await proxy.close()
    server.close()
    return total / took / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--mbytes", type=int, default=256)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pycri-bench-") as d:
        tmp = Path(d)
        (tmp / "net.d").mkdir()
        (tmp / "pycri.toml").write_text(
            '[cadvisor]\ndefault_path = ""\n'  # the host's path: never linked by a bench
            f'[cni]\nconf_dir = "{tmp / "net.d"}"\n'
            f'[images]\nregistries_conf = "{tmp / "registries.conf"}"\n'
            f'registries_conf_dir = "{tmp / "registries.conf.d"}"\n'
        )
        serve = [sys.executable, "-m", "pycri", "serve", "--config", str(tmp / "pycri.toml"),
                 "--root", str(tmp / "root"), "--state", str(tmp / "state")]
        daemon = subprocess.Popen(serve, stderr=subprocess.DEVNULL)
        try:
            print("direct :", latency(f"unix:{tmp / 'state' / 'pycri.sock'}", args.calls))
        finally:
            daemon.terminate()
            daemon.wait()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(tmp / "activated.sock"))
            listener.listen(64)
            fd = listener.fileno()
            daemon = subprocess.Popen(
                [sys.executable, "-c", ACTIVATE, str(fd), *serve], pass_fds=(fd,),
                env={**os.environ, "LISTEN_FDS": "1"}, stderr=subprocess.DEVNULL,
            )
            try:
                print("relayed:", latency(f"unix:{tmp / 'activated.sock'}", args.calls))
            finally:
                daemon.terminate()
                daemon.wait()
        mbps = asyncio.run(throughput(tmp, args.mbytes << 20))
        print(f"relay throughput: {mbps:.0f} MB/s on one connection")


if __name__ == "__main__":
    main()
