"""What a checkpoint's processes were allowed, read from CRIU's own images, against what the
new container's OCI spec grants.

CRIU restores each thread's credentials (uids, gids, groups, capability sets), its
seccomp mode and filters and its LSM label from `core-<tid>.img`, whatever the spec
says, and nothing takes them away afterwards. The images are input like any request
(anyone can write an archive or image), so a restore goes ahead only where every
thread had no more than a process started from the spec could reach by itself; else
FailedPrecondition names each difference.

Only the few fields needed are decoded, by hand (protobuf wire format), with the field
numbers of CRIU's images/core.proto and creds.proto: CoreEntry.thread_core = 5,
ThreadCoreEntry.creds = 10 and .seccomp_mode = 11, CredsEntry uid..fsuid = 1-8,
cap_inh/prm/eff/bnd = 9-12, groups = 14, lsm_profile = 15. A file is the magic words,
then one entry: its 32-bit length and the message.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pycri.errors import FailedPrecondition, InvalidArgument
from pycri.oci.spec import ALL_CAPABILITIES, capabilities_from_mask

IMG_COMMON, IMG_SERVICE, CORE = 0x54564319, 0x55105940, 0x55053847
MAX_CORE_BYTES = 1 << 20  # one thread's core image is a few KiB
MAX_THREADS = 100_000
SECCOMP_DISABLED = 0
# The spec's set (OCI name) that bounds each of CRIU's: a thread may raise its effective
# and inheritable capabilities only within its permitted ones.
CAP_SETS = {"cap_prm": "permitted", "cap_eff": "permitted", "cap_inh": "permitted",
            "cap_bnd": "bounding"}
_CAP_FIELDS = {9: "cap_inh", 10: "cap_prm", 11: "cap_eff", 12: "cap_bnd"}


@dataclass
class Thread:
    """One thread's credentials, as CRIU will restore them."""

    image: str  # core-<tid>.img
    uids: set[int]
    gids: set[int]
    groups: set[int]
    caps: dict[str, int]  # CRIU's set name: mask
    seccomp: int
    lsm: str


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a message: ints for varints and fixed words, bytes for
    length-delimited fields."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield number, value
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if i + size > len(buf):
                raise ValueError("truncated field")
            yield number, int.from_bytes(buf[i:i + size], "little")
            i += size
        elif wire == 2:
            size, i = _varint(buf, i)
            if i + size > len(buf):
                raise ValueError("truncated field")
            yield number, buf[i:i + size]
            i += size
        else:
            raise ValueError(f"wire type {wire}")


def _message(buf: bytes, number: int) -> bytes | None:
    found = None
    for n, v in _fields(buf):
        if n == number and isinstance(v, bytes):
            found = v  # protobuf: the last one wins
    return found


def _ints(v: int | bytes) -> list[int]:
    """A repeated integer field's values, packed or not."""
    if isinstance(v, int):
        return [v]
    out, i = [], 0
    while i < len(v):
        n, i = _varint(v, i)
        out.append(n)
    return out


def _creds(name: str, core: bytes) -> Thread:
    thread_core = _message(core, 5)
    creds = _message(thread_core, 10) if thread_core is not None else None
    if thread_core is None or creds is None:
        raise ValueError("no credentials in it")
    seccomp = 0
    for n, v in _fields(thread_core):
        if n == 11 and isinstance(v, int):
            seccomp = v
    t = Thread(name, set(), set(), set(), dict.fromkeys(CAP_SETS, 0), seccomp, "")
    words: dict[str, list[int]] = {k: [] for k in CAP_SETS}
    for n, v in _fields(creds):
        if isinstance(v, int) and 1 <= n <= 8:
            (t.uids if n in (1, 3, 5, 7) else t.gids).add(v)
        elif n in _CAP_FIELDS:
            words[_CAP_FIELDS[n]] += _ints(v)
        elif n == 14:
            t.groups.update(_ints(v))
        elif n == 15 and isinstance(v, bytes):
            t.lsm = v.decode(errors="replace")
    for key, ws in words.items():
        t.caps[key] = sum((w & 0xFFFFFFFF) << (32 * i) for i, w in enumerate(ws))
    return t


def _read_core(path: Path) -> bytes:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CORE_BYTES:
        raise ValueError(f"not a regular file of at most {MAX_CORE_BYTES} bytes")
    data = path.read_bytes()
    magic, at = _u32(data, 0), 4
    if magic in (IMG_COMMON, IMG_SERVICE):
        magic, at = _u32(data, 4), 8
    if magic != CORE:
        raise ValueError("not a CRIU core image")
    size = _u32(data, at)
    if at + 4 + size > len(data):
        raise ValueError("truncated")
    return data[at + 4:at + 4 + size]


def _u32(data: bytes, at: int) -> int:
    if at + 4 > len(data):
        raise ValueError("truncated")
    word: int = struct.unpack_from("<I", data, at)[0]
    return word


def threads(images: Path) -> list[Thread]:
    """Every thread of the checkpoint in `images` (CRIU's image directory)."""
    names = sorted(n for n in os.listdir(images)
                   if n.startswith("core-") and n.endswith(".img"))
    if not names:
        raise InvalidArgument("image: the checkpoint has no process (no core-<pid>.img)")
    if len(names) > MAX_THREADS:
        raise InvalidArgument(f"image: the checkpoint has more than {MAX_THREADS} threads")
    out = []
    for name in names:
        try:
            out.append(_creds(name, _read_core(images / name)))
        except (OSError, ValueError) as e:
            raise InvalidArgument(f"image: the checkpoint's {name[:80]} is unreadable: "
                                  f"{e}") from None
    return out


def _mask(names: list[str]) -> int:
    return sum(1 << ALL_CAPABILITIES.index(n) for n in names if n in ALL_CAPABILITIES)


def _ids(ids: set[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids))


def beyond(t: Thread, spec: dict[str, Any]) -> list[str]:
    """What thread `t` had that a process of `spec` could not reach by itself."""
    process = spec.get("process", {})
    user = process.get("user", {})
    caps = process.get("capabilities", {})
    granted = {key: _mask(caps.get(key, [])) for key in set(CAP_SETS.values())}
    can = capabilities_from_mask(granted["permitted"])
    uid, gid = user.get("uid", 0), user.get("gid", 0)
    groups = {gid, *user.get("additionalGids", [])}
    out = []
    if t.uids != {uid} and "CAP_SETUID" not in can:
        out.append(f"ran as uid {_ids(t.uids)}, the request grants uid {uid}")
    if t.gids != {gid} and "CAP_SETGID" not in can:
        out.append(f"ran as gid {_ids(t.gids)}, the request grants gid {gid}")
    if not t.groups <= groups and "CAP_SETGID" not in can:
        out.append(f"had groups {_ids(t.groups - groups)}, which the request does not grant")
    extra = 0
    for key, bound in CAP_SETS.items():
        extra |= t.caps[key] & ~granted[bound]
    if extra:
        names = [*capabilities_from_mask(extra)]
        if extra >> len(ALL_CAPABILITIES):
            names.append(f"capabilities past {ALL_CAPABILITIES[-1]}")
        out.append(f"had capabilities the request does not grant: {' '.join(names)}")
    if "seccomp" in spec.get("linux", {}) and t.seccomp == SECCOMP_DISABLED:
        out.append("ran without seccomp, the request asks for a seccomp profile")
    wanted = process.get("apparmorProfile") or process.get("selinuxLabel") or ""
    if wanted and t.lsm != wanted:
        out.append(f"ran under LSM label {t.lsm or 'none'!r}, the request asks for {wanted!r}")
    return out


def check(images: Path, spec: dict[str, Any]) -> None:
    """FailedPrecondition unless every checkpointed thread is within what `spec` grants."""
    problems: dict[str, list[str]] = {}
    for t in threads(images):
        for p in beyond(t, spec):
            problems.setdefault(p, []).append(t.image)
    if problems:
        raise FailedPrecondition(
            "the checkpoint's processes had more than the request grants (a restore keeps "
            "them): " + "; ".join(f"{', '.join(ts[:3])}{'…' if len(ts) > 3 else ''} {p}"
                                  for p, ts in problems.items()))
