"""Network counters of a pod, read through its infra process's view of /proc/net/dev.

`/proc/<pid>/net/dev` shows the interfaces of the network namespace that <pid>
lives in, so no setns is needed to read a pod's counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from pycri.cgroups import read_text


@dataclass(frozen=True)
class Interface:
    name: str
    rx_bytes: int
    rx_errors: int
    tx_bytes: int
    tx_errors: int
    rx_packets: int = 0
    rx_dropped: int = 0
    tx_packets: int = 0
    tx_dropped: int = 0


def parse(text: str) -> list[Interface]:
    """Parse /proc/net/dev; the loopback interface is left out (it is not pod traffic).

    Columns after the name: receive bytes packets errs drop fifo frame compressed
    multicast, then transmit bytes packets errs drop fifo colls carrier compressed.
    """
    out = []
    for line in text.splitlines()[2:]:
        name, _, counters = line.partition(":")
        fields = counters.split()
        if name.strip() == "lo" or len(fields) < 16:
            continue
        f = [int(x) for x in fields[:16]]
        out.append(Interface(name.strip(), rx_bytes=f[0], rx_errors=f[2], tx_bytes=f[8],
                             tx_errors=f[10], rx_packets=f[1], rx_dropped=f[3],
                             tx_packets=f[9], tx_dropped=f[11]))
    return out


def interfaces(pid: int) -> list[Interface]:
    """The pod's interfaces; none once its process is gone."""
    return parse(read_text(f"/proc/{pid}/net/dev"))
