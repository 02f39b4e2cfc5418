"""A stand-in for the daemon, run as its own process by the tests.

Plain mode: create + start a container through conmon, print the pids, exit (the
test then checks conmon outlived us). Reaper mode: be a child subreaper, run the
container, SIGKILL it, and report whether the re-parented conmon was reaped.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from pycri.monitor import conmon
from pycri.monitor.exits import ExitWatcher
from pycri.monitor.reaper import Reaper
from pycri.oci.runtime import OCIRuntime
from tests.monitor.ocibundle import RUNTIMES


def children() -> list[int]:
    """Every child of this process, running or a zombie."""
    return _children(zombies_only=False)


def zombie_children() -> list[int]:
    return _children(zombies_only=True)


def _children(zombies_only: bool) -> list[int]:
    me = os.getpid()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and (fields[0] == "Z" or not zombies_only):
            found.append(int(d.name))
    return found


def ppid_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def main(args: dict[str, Any]) -> dict[str, Any]:
    runtime = OCIRuntime(args["runtime"], RUNTIMES[args["runtime"]], Path(args["root"]))
    reaped: list[int] = []
    reaper = None
    if args.get("reaper"):
        reaper = Reaper(on_reaped=lambda pid, status: reaped.append(pid))
        reaper.start()
    exit_codes: asyncio.Queue[int] = asyncio.Queue()
    watcher = ExitWatcher(Path(args["exit_dir"]), lambda c, code, at: exit_codes.put_nowait(code))
    watcher.start()
    created = await conmon.create(
        args["cid"],
        Path(args["bundle"]),
        runtime=runtime,
        log_path=Path(args["log"]),
        exit_dir=Path(args["exit_dir"]),
        persist_dir=Path(args["persist"]),
        reaper=reaper,
    )
    await runtime.start(args["cid"])
    result: dict[str, Any] = {"pid": created.pid, "conmon_pid": created.conmon_pid}
    if reaper is None:
        return result
    result["conmon_parent_was_us"] = ppid_of(created.conmon_pid) == os.getpid()
    await runtime.kill(args["cid"], signal.SIGKILL)
    result["exit_code"] = await asyncio.wait_for(exit_codes.get(), 10)
    await conmon.wait_gone(created.conmon_pid, 10)
    for _ in range(100):  # SIGCHLD is handled by the loop; give it a turn or a few
        if reaped:
            break
        await asyncio.sleep(0.01)
    result["reaped"] = reaped
    result["zombies"] = zombie_children()
    watcher.close()
    reaper.close()
    return result


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
