"""A RunPodSandbox cancelled half-way inside a real daemon, run as its own process by
tests/e2e/test_concurrent_pod_start.py (the daemon makes its process a child
subreaper, which pytest's must not be). Over gRPC no client can cancel it: the
servicer shields the work from a client that goes away, so the cancel comes from
inside, as it does when the daemon's loop shuts down.

argv: config root state socket pod-name runtime-dir plugin-pid-file. The pod runs on
handler "hang", whose create the test made hang after its work, while the chained
plugin hangs in its ADD: once both are in flight the run is cancelled, and one JSON
line says so. After a line on stdin (the test has checked the host and lifted the
faults) the same pod runs again, is stopped and removed, and a second line says how.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from pycri.api import api_pb2 as pb
from pycri.config import load, validate
from pycri.daemon import Daemon

WAIT = 30.0


def _say(**doc: object) -> None:
    print(json.dumps(doc), flush=True)


async def _both_in_flight(runtime_dir: Path, plugin_pids: Path) -> None:
    deadline = time.monotonic() + WAIT
    while not ((runtime_dir / "done-before-hang").exists() and plugin_pids.exists()
               and plugin_pids.read_text().strip()):
        if time.monotonic() > deadline:
            raise TimeoutError("the infra create and the CNI ADD were never both in flight")
        await asyncio.sleep(0.05)


async def main(argv: list[str]) -> None:
    config, root, state, socket, name, runtime_dir, plugin_pids = argv
    cfg = load(Path(config), {"root": root, "state": state, "socket": socket})
    validate(cfg, check_binaries=True)
    pod = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="e2e", uid=f"uid-{name}"))
    daemon = Daemon(cfg)
    await daemon.start()
    try:
        sandboxes = daemon.sandboxes
        assert sandboxes is not None
        run = asyncio.create_task(sandboxes.run(pod, "hang"))
        await _both_in_flight(Path(runtime_dir), Path(plugin_pids))
        sid = next(iter(sandboxes.sandboxes))  # its record is written first
        run.cancel()
        try:
            await run
            outcome = "finished"
        except asyncio.CancelledError:
            outcome = "cancelled"
        _say(outcome=outcome, id=sid, records=len(sandboxes.sandboxes))
        await asyncio.to_thread(sys.stdin.readline)
        sid = await sandboxes.run(pod, "hang")
        ready = sandboxes.get(sid).state == pb.SANDBOX_READY
        await sandboxes.stop(sid)
        await sandboxes.remove(sid)
        _say(ready=ready, id=sid, records=len(sandboxes.sandboxes))
    finally:
        await daemon.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
