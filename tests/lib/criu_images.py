"""CRIU image files for tests, encoded by CRIU's own `crit` (Debian's criu package), so
what pycri reads is what CRIU writes, on hosts where CRIU itself cannot dump.

    write_core(images_dir, pid=1, uid=1000, caps=[], seccomp="filter")
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from pycri.oci.spec.capabilities import ALL_CAPABILITIES

CRIT = shutil.which("crit") or "/usr/bin/crit"


def cap_words(caps: Iterable[str]) -> list[int]:
    """Capability names as CRIU stores a set: two 32-bit words, bit n = capability n."""
    mask = 0
    for c in caps:
        mask |= 1 << ALL_CAPABILITIES.index(c)
    return [mask & 0xFFFFFFFF, mask >> 32]


def write_core(images: Path, pid: int = 1, uid: int = 1000, gid: int | None = None,
               caps: Iterable[str] = (), seccomp: str = "filter",
               groups: Iterable[int] = ()) -> Path:
    """`images`/core-<pid>.img for one thread running as `uid` (all its uids) with `caps`
    in every capability set and seccomp mode `seccomp` ("disabled", "strict", "filter")."""
    gid = uid if gid is None else gid
    words = cap_words(caps)
    creds = {**{k: uid for k in ("uid", "euid", "suid", "fsuid")},
             **{k: gid for k in ("gid", "egid", "sgid", "fsgid")},
             "cap_inh": [0, 0], "cap_prm": words, "cap_eff": words, "cap_bnd": words,
             "secbits": 0}
    if groups := list(groups):  # crit cannot encode an empty list
        creds["groups"] = groups
    doc = {"magic": "CORE", "entries": [{
        "mtype": "X86_64",
        "tc": {"task_state": 1, "exit_code": 0, "personality": 0, "flags": 0,
               "blk_sigset": 0, "comm": "sh"},
        "thread_core": {"futex_rla": 0, "futex_rla_len": 0, "creds": creds,
                        "seccomp_mode": seccomp},
    }]}
    images.mkdir(parents=True, exist_ok=True)
    out = images / f"core-{pid}.img"
    subprocess.run([CRIT, "encode", "-o", str(out)], input=json.dumps(doc).encode(),
                   check=True, capture_output=True, timeout=60)
    return out
