#!/usr/bin/env python3
"""What NRI costs a pod+container start: three private pycri daemons side by side.

Not a test. It starts a loopback registry with the busybox test image and three
`pycri serve` from this tree, each on its own root, socket and CNI bridge:

  disabled   [nri] enable = false
  idle       [nri] enabled, no plugin connected
  plugin     [nri] enabled, one test plugin (tests/lib/nri_plugin.py) subscribed to
             every event, answering each at once

and, round by round in rotating order, runs on each a pod, creates and starts a sleep
container in it (timed: "start"), then stops and removes the pod (timed: "teardown").
It prints each mode's medians (ms) and the ratio to `disabled`, and the plugin's
added latency per pod+container start. Since that difference drowns in the noise of
a loaded host, it first measures the wire alone: one CreateContainer round trip
between a PluginLink and the test plugin over a socketpair, both in this process.

Run as root from the repository:  .venv/bin/python hack/bench-nri.py [--rounds 30] [--json F]
Everything it made (daemons by pid, pods, bridges, mounts) is removed at the end,
also after an error or ^C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pycri.api import api_pb2 as pb  # noqa: E402
from pycri.nri.api import api_pb2 as nri  # noqa: E402
from pycri.nri.link import PluginLink  # noqa: E402
from tests.conftest import CRIClient, PycriProcess  # noqa: E402
from tests.lib import images  # noqa: E402
from tests.lib.nri_plugin import ALL_EVENTS, NRIPlugin, PluginThread  # noqa: E402
from tests.lib.registry import Registry  # noqa: E402

sys.path.insert(0, str(REPO / "hack"))
from benchlib import (  # noqa: E402
    TIMEOUT,
    median,
    private_daemon,
    quantile,
    sleep_pod,
    start,
    tear_down,
)

MODES = ("disabled", "idle", "plugin")


class _Runtime:
    async def register_plugin(self, link: PluginLink, req: nri.RegisterPluginRequest) -> None:
        await link.call("Configure", nri.ConfigureRequest(), nri.ConfigureResponse, 5)

    async def update_containers(self, link: PluginLink, req: nri.UpdateContainersRequest
                                ) -> nri.UpdateContainersResponse:
        return nri.UpdateContainersResponse()


async def wire_round_trips(calls: int) -> list[float]:
    """CreateContainer round trips (ms) of a typical pod and container."""
    a, b = socket.socketpair()
    link = PluginLink(a, _Runtime())
    plugin = NRIPlugin("bench", "50")
    await link.start()
    await plugin.connect(b)
    pod = nri.PodSandbox(id="p" * 64, name="pod", uid="u" * 36, namespace="default",
                         labels={f"label{i}": "value" for i in range(8)},
                         annotations={f"annotation{i}": "x" * 40 for i in range(8)})
    ctr = nri.Container(id="c" * 64, pod_sandbox_id=pod.id, name="app",
                        args=["/bin/app", "--flag"] * 4,
                        env=[f"VAR{i}=value{i}" for i in range(20)],
                        mounts=[nri.Mount(destination=f"/m{i}", source=f"/src/{i}", type="bind",
                                          options=["rbind", "ro"]) for i in range(10)])
    req = nri.CreateContainerRequest(pod=pod, container=ctr)
    out = []
    try:
        for _ in range(calls):
            t = time.perf_counter()
            await link.call("CreateContainer", req, nri.CreateContainerResponse, 5)
            out.append((time.perf_counter() - t) * 1000)
    finally:
        await plugin.close()
        await link.close()
    return out


@dataclass
class Daemon:
    mode: str
    tmp: Path
    bridge: str
    image: str
    proc: PycriProcess
    cri: CRIClient | None = None
    plugin: PluginThread | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)

    @property
    def nri_socket(self) -> Path:
        return self.tmp / "nri" / "nri.sock"

    def start(self) -> None:
        self.cri = start(self.proc, self.image)
        if self.mode == "plugin":
            self.plugin = PluginThread("bench", "50", ALL_EVENTS).connect(str(self.nri_socket))

    def round(self, n: int) -> None:
        assert self.cri is not None
        rt = self.cri.runtime
        cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=f"b{n}", namespace="bench-nri", uid=f"u{n}"),
            log_directory=str(self.tmp / "logs" / f"b{n}"))
        t0 = time.perf_counter()
        sid, _ = sleep_pod(self.cri, cfg, self.image)
        t1 = time.perf_counter()
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=TIMEOUT)
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=TIMEOUT)
        t2 = time.perf_counter()
        self.samples.setdefault("start", []).append((t1 - t0) * 1000)
        self.samples.setdefault("teardown", []).append((t2 - t1) * 1000)

    def close(self) -> None:
        if self.plugin is not None:
            self.plugin.close()
        tear_down(self.cri, self.proc, self.tmp, self.bridge)


def make_daemon(mode: str, tmp: Path, image: str, n: int, tag: str) -> Daemon:
    bridge = f"pcn{tag}{n}"[:15]
    nri = (f'[nri]\nenable = {"false" if mode == "disabled" else "true"}\n'
           f'socket_path = "{tmp / "nri" / "nri.sock"}"\n'
           f'plugin_path = "{tmp / "nri-plugins"}"\n'
           f'plugin_config_path = "{tmp / "nri-conf.d"}"\n')
    proc = private_daemon(tmp, bridge, f"10.197.{n + 10 * (int(tag, 16) % 20)}.0/24", nri)
    (tmp / "nri").mkdir()
    (tmp / "nri-plugins").mkdir()
    (tmp / "nri-conf.d").mkdir()
    return Daemon(mode, tmp, bridge, image, proc)


@contextlib.contextmanager
def daemons(base: Path, image: str) -> Iterator[list[Daemon]]:
    tag = secrets.token_hex(1)
    made: list[Daemon] = []
    try:
        for n, mode in enumerate(MODES):
            d = make_daemon(mode, base / mode, image, n, tag)
            made.append(d)
            d.start()
        yield made
    finally:
        for d in made:
            with contextlib.suppress(Exception):
                d.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--wire-calls", type=int, default=2000)
    ap.add_argument("--json", type=Path, help="write the raw samples here")
    args = ap.parse_args()
    wire = asyncio.run(wire_round_trips(args.wire_calls))[args.wire_calls // 10:]
    print(f"wire: CreateContainer round trip PluginLink <-> test plugin, {len(wire)} calls: "
          f"median {median(wire):.3f} ms, p99 {quantile(wire, 0.99):.3f} ms; the 5 events "
          f"of a pod+container start (RunPodSandbox, CreateContainer, PostCreateContainer, "
          f"StartContainer, PostStartContainer) ~ {5 * median(wire):.2f} ms")
    with tempfile.TemporaryDirectory(prefix="bench-nri-", dir="/var/tmp") as td:
        base = Path(td)
        reg = Registry(base / "registry")
        reg.start()
        try:
            image = images.push_busybox(reg.addr, base / "layout")
            with daemons(base, image) as ds:
                for n in range(args.warmup + args.rounds):
                    order = ds[n % 3:] + ds[:n % 3]  # rotate: no mode always goes first
                    for d in order:
                        d.round(n)
                    if n < args.warmup:
                        for d in ds:
                            d.samples.clear()
                events = ds[2].plugin.names() if ds[2].plugin is not None else []
                results = {d.mode: d.samples for d in ds}
        finally:
            reg.stop()
    base_ms = {k: median(v) for k, v in results["disabled"].items()}
    print(f"pod+container start and teardown, {args.rounds} rounds: median ms "
          "(ratio to NRI disabled) [p25-p75]")
    print(f"{'mode':10} {'start':>32} {'teardown':>32}")
    for mode in MODES:
        cells = []
        for key in ("start", "teardown"):
            xs = results[mode][key]
            m = median(xs)
            cells.append(f"{m:7.1f} ({m / base_ms[key]:4.2f}x) "
                         f"[{quantile(xs, 0.25):.0f}-{quantile(xs, 0.75):.0f}]")
        print(f"{mode:10} {cells[0]:>32} {cells[1]:>32}")
    added = median(results["plugin"]["start"]) - median(results["idle"]["start"])
    print(f"plugin subscribed to all events: {added:+.1f} ms per pod+container start "
          f"(vs NRI idle); it saw {len(events)} requests")
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "samples": results,
                                         "plugin_requests": len(events), "wire_ms": wire},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
