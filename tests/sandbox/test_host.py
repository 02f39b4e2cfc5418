"""sandbox/host.py: the daemon's own bounding set and OOM score, read from /proc in a
child process whose own were changed first (as a restricted service manager would)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pycri.oci import spec

CHILD = """
import ctypes, sys
from pycri.sandbox.host import own_capabilities, own_oom_score_adj
libc = ctypes.CDLL(None, use_errno=True)
for cap in map(int, sys.argv[2:]):
    assert libc.prctl(24, cap, 0, 0, 0) == 0, ctypes.get_errno()  # PR_CAPBSET_DROP
with open("/proc/self/oom_score_adj", "w") as f:
    f.write(sys.argv[1])
print(own_oom_score_adj())
print(" ".join(own_capabilities()))
"""


def host_facts(oom: int, drop: list[int]) -> tuple[int, list[str]]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(oom), *map(str, drop)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return int(out[0]), out[1].split()


def test_oom_score_adj_is_the_processs_own() -> None:
    assert host_facts(321, [])[0] == 321  # raising it needs no privilege


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping from the bounding set needs root")
def test_capabilities_are_the_bounding_set() -> None:
    _, full = host_facts(0, [])
    assert full and set(full) <= set(spec.ALL_CAPABILITIES)
    dropped = {"CAP_SYS_ADMIN", "CAP_NET_RAW"} & set(full)
    assert dropped, "this host's bounding set lacks both capabilities to drop"
    _, caps = host_facts(0, [spec.ALL_CAPABILITIES.index(c) for c in dropped])
    assert set(full) - set(caps) == dropped
