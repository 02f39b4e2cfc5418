"""What `pycri pull` and `pycri pulls` show of the daemon's pulls (issue 42).

Both read the daemon's Pulls service (proto/pycri/v1/pulls.proto) on its socket. On a
terminal they draw with rich (bars, a live table); on a pipe or a file they write plain
lines, one per change of phase and at most one every PLAIN_EVERY seconds otherwise, so
a log of a long pull stays readable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import grpc

from pycri.api import api_pb2 as cri
from pycri.api import api_pb2_grpc as cri_grpc
from pycri.api import pulls_pb2 as pb
from pycri.api import pulls_pb2_grpc

POLL = 0.25  # seconds between two reads of the state while a pull runs
PLAIN_EVERY = 5.0  # seconds between two plain progress lines of one pull
RPC_TIMEOUT = 10.0


def channel(socket: Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{socket}")


def list_pulls(ch: grpc.Channel) -> list[pb.Pull]:
    stub = pulls_pb2_grpc.PullsStub(ch)
    return list(stub.ListPulls(pb.ListPullsRequest(), timeout=RPC_TIMEOUT).pulls)


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def _eta(seconds: float) -> str:
    return "?" if seconds < 0 else f"{seconds:.0f}s"


def pull_line(p: pb.Pull) -> str:
    """One pull on one line: reference, phase, time, bytes, rate, layers, clients."""
    got = sum(x.fetched for x in p.layers)
    total = sum(x.size for x in p.layers)
    rate = sum(x.bytes_per_second for x in p.layers)
    done = sum(1 for x in p.layers if x.done)
    return (f"{p.reference}: {p.phase} {p.seconds:.0f}s, {_mb(got)} of {_mb(total)}, "
            f"{_mb(rate)}/s, layers {done}/{len(p.layers)} done, {p.clients} client(s)")


def layer_line(x: pb.Layer) -> str:
    state = "done" if x.done else (f"{_mb(x.fetched)} of {_mb(x.size)} from {x.endpoint}, "
                                   f"{_mb(x.bytes_per_second)}/s, ETA {_eta(x.eta_seconds)}")
    return f"  {x.digest[:19]}  {state}"


def print_pulls(pulls: list[pb.Pull], out: IO[str]) -> None:
    if not pulls:
        out.write("no pulls in flight\n")
    for p in pulls:
        out.write(pull_line(p) + "\n")
        for x in p.layers:
            out.write(layer_line(x) + "\n")
    out.flush()


def watch_pulls(ch: grpc.Channel, out: IO[str], tty: bool, interval: float = 1.0,
                until: Callable[[], bool] = lambda: False) -> None:
    """Show the pulls every `interval` seconds until ^C (or `until()`): a live table on
    a terminal, a block of lines with the time before it elsewhere."""
    if not tty:
        while not until():
            out.write(time.strftime("-- %H:%M:%S\n"))
            print_pulls(list_pulls(ch), out)
            time.sleep(interval)
        return
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    def table() -> Table:
        t = Table("image / layer", "phase", "fetched", "rate", "ETA", "clients")
        for p in list_pulls(ch):
            got = sum(x.fetched for x in p.layers)
            total = sum(x.size for x in p.layers)
            t.add_row(p.reference, p.phase, f"{_mb(got)} / {_mb(total)}",
                      _mb(sum(x.bytes_per_second for x in p.layers)) + "/s", "", str(p.clients))
            for x in p.layers:
                t.add_row("  " + x.digest[:19], "done" if x.done else x.endpoint,
                          f"{_mb(x.fetched)} / {_mb(x.size)}", _mb(x.bytes_per_second) + "/s",
                          "" if x.done else _eta(x.eta_seconds), "")
        return t

    with Live(table(), console=Console(file=out), refresh_per_second=4) as live:
        while not until():
            time.sleep(interval)
            live.update(table())


def pull(ch: grpc.Channel, ref: str, normalized: str, out: IO[str], tty: bool,
         auth: cri.AuthConfig | None = None) -> str:
    """PullImage `ref` and show its progress (the pull named `normalized` in the state)
    until it ends; returns the image ID. A gRPC error is raised as it came."""
    stub = cri_grpc.ImageServiceStub(ch)
    request = cri.PullImageRequest(image=cri.ImageSpec(image=ref), auth=auth)
    call = stub.PullImage.future(request)
    try:
        if tty:
            _bars(ch, normalized, call, out)
        else:
            _plain(ch, normalized, call, out)
        return str(call.result().image_ref)
    except BaseException:
        call.cancel()  # ^C: the daemon's pull ends with its last client
        raise


def _ours(ch: grpc.Channel, normalized: str) -> pb.Pull | None:
    return next((p for p in list_pulls(ch) if p.reference == normalized), None)


def _plain(ch: grpc.Channel, normalized: str, call: grpc.Future, out: IO[str]) -> None:
    phase, last = "", 0.0
    while not call.done():
        p = _ours(ch, normalized)
        now = time.monotonic()
        if p is not None and (p.phase != phase or now - last >= PLAIN_EVERY):
            out.write(pull_line(p) + "\n")
            out.flush()
            phase, last = p.phase, now
        time.sleep(POLL)


def _bars(ch: grpc.Channel, normalized: str, call: grpc.Future, out: IO[str]) -> None:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeRemainingColumn())
    tasks: dict[str, TaskID] = {}
    with Progress(*columns, console=Console(file=out), transient=False) as bars:
        status = bars.add_task(f"{normalized}: resolving", total=None)
        while not call.done():
            p = _ours(ch, normalized)
            if p is not None:
                bars.update(status, description=f"{normalized}: {p.phase}")
                for x in p.layers:
                    if x.digest not in tasks:
                        tasks[x.digest] = bars.add_task(x.digest[:19], total=x.size)
                    bars.update(tasks[x.digest], completed=x.size if x.done else x.fetched)
            time.sleep(POLL)
        if call.exception() is not None:
            bars.update(status, description=f"{normalized}: failed")
            return
        bars.update(status, description=f"{normalized}: done", total=1, completed=1)
        for task in tasks.values():
            bars.update(task, completed=bars.tasks[task].total)
