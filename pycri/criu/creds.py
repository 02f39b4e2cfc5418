"""What a checkpoint's processes were allowed, read from CRIU's own images, against what the
new container's OCI spec grants.

CRIU restores each thread's credentials (uids, gids, groups, capability sets), its
seccomp mode and filters and its LSM label from `core-<tid>.img` (the filters themselves
from `seccomp.img`), whatever the spec says, and nothing takes them away afterwards.
The images are input like any request (anyone can write an archive or image), so a
restore goes ahead only where every thread had no more than a process started from the
spec could reach by itself; else FailedPrecondition names each difference. Seccomp
filters are compared with the program the spec's profile compiles to (libseccomp.py),
syscall by syscall (bpf.py): a thread whose filters let through anything the profile
would not is refused.

Only the few fields needed are decoded, by hand (protobuf wire format), with the field
numbers of CRIU's images/core.proto and creds.proto: CoreEntry.thread_core = 5,
ThreadCoreEntry.creds = 10, .seccomp_mode = 11 and .seccomp_filter = 12 (older images:
TaskCoreEntry, CoreEntry.tc = 3, fields 11 and 12), CredsEntry uid..fsuid = 1-8,
cap_inh/prm/eff/bnd = 9-12, groups = 14, lsm_profile = 15; seccomp.proto's SeccompEntry
.seccomp_filters = 1, each SeccompFilter .filter = 1, .prev = 2, .flags = 3. A file is
the magic words, then one entry: its 32-bit length and the message.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pycri.criu import bpf, libseccomp
from pycri.errors import FailedPrecondition, InvalidArgument
from pycri.oci.spec import ALL_CAPABILITIES, capabilities_from_mask

IMG_COMMON, IMG_SERVICE, CORE, SECCOMP = 0x54564319, 0x55105940, 0x55053847, 0x64413049
MAX_CORE_BYTES = 1 << 20  # one thread's core image is a few KiB
MAX_SECCOMP_BYTES = 16 << 20  # every distinct filter of every thread
MAX_FILTERS = 1024
MAX_THREADS = 100_000
SECCOMP_DISABLED, SECCOMP_STRICT, SECCOMP_FILTER = 0, 1, 2
FILTER_FLAG_SPEC_ALLOW = 4  # SECCOMP_FILTER_FLAG_SPEC_ALLOW: speculation unmitigated
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
    seccomp_filter: int | None = None  # index in seccomp.img of its newest filter


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
    # CRIU takes the thread's seccomp fields, and the task's (older images) where the
    # thread has none.
    task_core = _message(core, 3)
    seccomp: dict[int, int] = {}
    for msg in (task_core, thread_core):
        for n, v in _fields(msg or b""):
            if n in (11, 12) and isinstance(v, int):
                seccomp[n] = v
    t = Thread(name, set(), set(), set(), dict.fromkeys(CAP_SETS, 0), seccomp.get(11, 0), "",
               seccomp.get(12))
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


def _read_image(path: Path, kind: int, limit: int) -> bytes:
    """The one entry of a CRIU image file of magic `kind`."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        raise ValueError(f"not a regular file of at most {limit} bytes")
    with open(path, "rb", opener=_no_follow) as f:
        data = f.read(limit + 1)
    magic, at = _u32(data, 0), 4
    if magic in (IMG_COMMON, IMG_SERVICE):
        magic, at = _u32(data, 4), 8
    if magic != kind:
        raise ValueError(f"not a CRIU {'core' if kind == CORE else 'seccomp'} image")
    size = _u32(data, at)
    if at + 4 + size > len(data):
        raise ValueError("truncated")
    return data[at + 4:at + 4 + size]


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


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
            out.append(_creds(name, _read_image(images / name, CORE, MAX_CORE_BYTES)))
        except (OSError, ValueError) as e:
            raise InvalidArgument(f"image: the checkpoint's {name[:80]} is unreadable: "
                                  f"{e}") from None
    return out


@dataclass(frozen=True)
class Filter:
    """One filter of seccomp.img: its program, the older filter below it, its flags."""

    program: bytes
    prev: int | None
    flags: int


def stored_filters(images: Path) -> list[Filter]:
    """seccomp.img's filters, in its order (a thread names its newest by index); none
    where the checkpoint has no such file."""
    path = images / "seccomp.img"
    if not os.path.lexists(path):
        return []
    out: list[Filter] = []
    for n, v in _fields(_read_image(path, SECCOMP, MAX_SECCOMP_BYTES)):
        if n != 1 or not isinstance(v, bytes):
            continue
        if len(out) >= MAX_FILTERS:
            raise ValueError(f"more than {MAX_FILTERS} filters")
        program, prev, flags = b"", None, 0
        for m, w in _fields(v):
            if m == 1 and isinstance(w, bytes):
                program = w
            elif m == 2 and isinstance(w, int):
                prev = w
            elif m == 3 and isinstance(w, int):
                flags = w
        out.append(Filter(program, prev, flags))
    return out


def filter_chain(filters: list[Filter], index: int) -> list[Filter]:
    """The filters a thread runs under: its newest, and each one's `prev` in turn."""
    out: list[Filter] = []
    at: int | None = index
    while at is not None:
        if at >= len(filters):
            raise ValueError(f"a thread names filter {at}, which is not there")
        if len(out) == len(filters):
            raise ValueError("its filters form a loop")
        out.append(filters[at])
        at = filters[at].prev
    return out


_ARCHES = {libseccomp.X86_64: "x86_64", 0x40000003: "x86", 0xC00000B7: "aarch64",
           0x40000028: "arm"}


class _Seccomp:
    """The checkpoint's seccomp filters against the request's profile: read, compiled
    and compared once per chain, however many threads share it."""

    def __init__(self, images: Path, profile: dict[str, Any]) -> None:
        self.images, self.profile = images, profile
        self._stored: list[Filter] | None = None
        self._wanted: bytes | None = None
        self._verdicts: dict[int, list[str]] = {}

    def beyond(self, t: Thread) -> list[str]:
        if t.seccomp in (SECCOMP_DISABLED, SECCOMP_STRICT):
            return []  # disabled: beyond() says so; strict allows less than any profile
        if t.seccomp != SECCOMP_FILTER:
            return [f"ran in seccomp mode {t.seccomp}, which the kernel does not have"]
        if t.seccomp_filter is None:
            return ["ran under seccomp filters the checkpoint does not hold"]
        if t.seccomp_filter not in self._verdicts:
            self._verdicts[t.seccomp_filter] = self._compare(t.seccomp_filter)
        return self._verdicts[t.seccomp_filter]

    def _compare(self, index: int) -> list[str]:
        try:
            if self._stored is None:
                self._stored = stored_filters(self.images)
            chain = filter_chain(self._stored, index)
        except (OSError, ValueError) as e:
            raise InvalidArgument(f"image: the checkpoint's seccomp.img is unreadable: {e}"
                                  ) from None
        out = []
        if (any(f.flags & FILTER_FLAG_SPEC_ALLOW for f in chain)
                and "SECCOMP_FILTER_FLAG_SPEC_ALLOW" not in (self.profile.get("flags") or [])):
            out.append("ran with speculative store bypass unmitigated "
                       "(SECCOMP_FILTER_FLAG_SPEC_ALLOW), which the request does not ask for")
        if self._wanted is None:
            try:
                self._wanted = libseccomp.compile_profile(self.profile)
            except libseccomp.Unavailable as e:
                raise FailedPrecondition(f"the checkpoint's seccomp filters cannot be "
                                         f"compared with the request's profile: {e}") from None
        try:
            found = bpf.looser([f.program for f in chain], self._wanted)
        except bpf.Uncomparable as e:
            return [*out, f"ran under seccomp filters that cannot be compared with the "
                          f"request's profile ({e})"]
        if found:
            shown = ", ".join(
                f"{_syscall(v.arch(), v.nr())} on {_ARCHES.get(v.arch(), hex(v.arch()))} "
                f"({_action(v.got)}, the profile: "
                f"{_action(v.wanted)})" for v in found[:4])
            out.append(f"ran under seccomp filters that let through what the request's "
                       f"profile does not: {shown}{', …' if len(found) > 4 else ''}")
        return out


def _syscall(arch: int, nr: int) -> str:
    return libseccomp.syscall_name(arch, nr) if arch in _ARCHES else f"syscall {nr}"


def _action(code: int) -> str:
    return bpf.NAMES.get(code & bpf.ACTION_MASK, f"action {code:#x}")


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
    profile = spec.get("linux", {}).get("seccomp")
    filters = _Seccomp(images, profile) if profile else None
    for t in threads(images):
        for p in [*beyond(t, spec), *(filters.beyond(t) if filters else [])]:
            problems.setdefault(p, []).append(t.image)
    if problems:
        raise FailedPrecondition(
            "the checkpoint's processes had more than the request grants (a restore keeps "
            "them): " + "; ".join(f"{', '.join(ts[:3])}{'…' if len(ts) > 3 else ''} {p}"
                                  for p, ts in problems.items()))
