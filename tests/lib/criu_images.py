"""CRIU image files for tests, encoded by CRIU's own `crit` (Debian's criu package), so
what pycri reads is what CRIU writes, on hosts where CRIU itself cannot dump.

    write_core(images_dir, pid=1, uid=1000, caps=[], seccomp="filter")
    write_seccomp(images_dir, [program, ...])
"""

from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
from collections.abc import Iterable
from pathlib import Path

from pycri.oci.spec.capabilities import ALL_CAPABILITIES

CRIT = shutil.which("crit") or "/usr/bin/crit"
# Seccomp filters of one instruction: every system call kills the process (stricter than
# any profile), or is let through.
DENY_ALL = struct.pack("<HBBI", 0x06, 0, 0, 0x80000000)
ALLOW_ALL = struct.pack("<HBBI", 0x06, 0, 0, 0x7FFF0000)


def _encode(doc: dict, out: Path) -> Path:
    subprocess.run([CRIT, "encode", "-o", str(out)], input=json.dumps(doc).encode(),
                   check=True, capture_output=True, timeout=60)
    return out


def write_seccomp(images: Path, programs: list[bytes], prevs: list[int | None] | None = None,
                  flags: int = 0) -> Path:
    """`images`/seccomp.img holding `programs`, filter i below filter i-1 unless `prevs`
    says otherwise (a thread names its newest filter's index)."""
    prevs = prevs if prevs is not None else [None, *range(len(programs) - 1)]
    filters = []
    for program, prev in zip(programs, prevs, strict=True):
        f: dict = {"filter": base64.b64encode(program).decode()}
        if prev is not None:
            f["prev"] = prev
        if flags:
            f["flags"] = flags
        filters.append(f)
    images.mkdir(parents=True, exist_ok=True)
    return _encode({"magic": "SECCOMP", "entries": [{"seccomp_filters": filters}]},
                   images / "seccomp.img")


def cap_words(caps: Iterable[str]) -> list[int]:
    """Capability names as CRIU stores a set: two 32-bit words, bit n = capability n."""
    mask = 0
    for c in caps:
        mask |= 1 << ALL_CAPABILITIES.index(c)
    return [mask & 0xFFFFFFFF, mask >> 32]


def write_core(images: Path, pid: int = 1, uid: int = 1000, gid: int | None = None,
               caps: Iterable[str] = (), seccomp: str = "filter",
               groups: Iterable[int] = (), seccomp_filter: int | None = 0,
               task_seccomp: bool = False) -> Path:
    """`images`/core-<pid>.img for one thread running as `uid` (all its uids) with `caps`
    in every capability set and seccomp mode `seccomp` ("disabled", "strict", "filter");
    in mode "filter" under filter `seccomp_filter` of seccomp.img, which is made holding
    DENY_ALL if there is none yet. `task_seccomp`: the mode and filter where older CRIUs
    kept them, in the task's core rather than the thread's."""
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
    entry = doc["entries"][0]
    if seccomp == "filter" and seccomp_filter is not None:
        entry["thread_core"]["seccomp_filter"] = seccomp_filter
        if not (images / "seccomp.img").exists():
            write_seccomp(images, [DENY_ALL])
    if task_seccomp:
        for key in ("seccomp_mode", "seccomp_filter"):
            if key in entry["thread_core"]:
                entry["tc"][f"old_{key}"] = entry["thread_core"].pop(key)
    return _encode(doc, images / f"core-{pid}.img")
