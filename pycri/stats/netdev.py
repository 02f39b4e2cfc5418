"""Network counters of a pod, read through its infra process's view of /proc/net/dev.

`/proc/<pid>/net/dev` shows the interfaces of the network namespace that <pid>
lives in, so no setns is needed to read a pod's counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Interface:
    name: str
    rx_bytes: int
    rx_errors: int
    tx_bytes: int
    tx_errors: int


def parse(text: str) -> list[Interface]:
    """Parse /proc/net/dev; the loopback interface is left out (it is not pod traffic)."""
    out = []
    for line in text.splitlines()[2:]:
        name, _, counters = line.partition(":")
        fields = counters.split()
        if name.strip() == "lo" or len(fields) < 16:
            continue
        out.append(Interface(name.strip(), int(fields[0]), int(fields[2]),
                             int(fields[8]), int(fields[10])))
    return out


def interfaces(pid: int) -> list[Interface]:
    try:
        return parse(Path(f"/proc/{pid}/net/dev").read_text())
    except OSError:
        return []
