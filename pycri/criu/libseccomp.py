"""An OCI `linux.seccomp` object compiled to the BPF program the runtime would load, by
the library runc and crun compile it with (libseccomp, through ctypes), so that bpf.py
can compare a checkpoint's filters with it.

The translation is the runtimes': the default action and each rule's action (ERRNO with
`errnoRet`, else EPERM); every listed architecture added; names the library does not
know skipped; a rule whose action is the default skipped; a rule's conditions ANDed,
unless two of them name the same argument, when each is a rule of its own. What the
runtimes add around the library's program (runc answers syscalls newer than the profile
with ENOSYS) is not part of it.

libseccomp is there wherever runc or crun is (both link it); without it, `Unavailable`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
from typing import Any

from pycri.errors import InvalidArgument

ACTIONS = {"SCMP_ACT_KILL": 0x00000000, "SCMP_ACT_KILL_THREAD": 0x00000000,
           "SCMP_ACT_KILL_PROCESS": 0x80000000, "SCMP_ACT_TRAP": 0x00030000,
           "SCMP_ACT_ERRNO": 0x00050000, "SCMP_ACT_NOTIFY": 0x7FC00000,
           "SCMP_ACT_TRACE": 0x7FF00000, "SCMP_ACT_LOG": 0x7FFC0000,
           "SCMP_ACT_ALLOW": 0x7FFF0000}
OPS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4,
       "SCMP_CMP_GE": 5, "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}
NR_ERROR = -1  # __NR_SCMP_ERROR: a name the library does not know
X86_64, X32, X32_BIT = 0xC000003E, 0x4000003E, 0x40000000  # x32 calls come as x86_64's
MAX_BPF = 1 << 20


class Unavailable(RuntimeError):
    """No libseccomp on this host."""


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


@functools.cache
def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise Unavailable(f"libseccomp is not installed ({e})") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_void_p
    lib.seccomp_syscall_resolve_num_arch.argtypes = [ctypes.c_uint32, ctypes.c_int]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _action(name: Any, errno_ret: Any) -> int:
    if name not in ACTIONS:
        raise InvalidArgument(f"seccomp: unknown action {str(name)[:64]!r}")
    code = ACTIONS[name]
    if name in ("SCMP_ACT_ERRNO", "SCMP_ACT_TRACE"):
        ret = errno.EPERM if errno_ret is None else errno_ret
        if not isinstance(ret, int) or not 0 <= ret <= 0xFFFF:
            raise InvalidArgument(f"seccomp: errnoRet {str(ret)[:32]} is out of range")
        code |= ret
    return code


def _conditions(args: list[Any]) -> list[list[_ArgCmp]]:
    """The rules one OCI rule's `args` make (see the module docstring)."""
    conds = []
    for a in args:
        if not isinstance(a, dict) or a.get("op") not in OPS:
            raise InvalidArgument(f"seccomp: bad argument condition {str(a)[:64]}")
        conds.append(_ArgCmp(int(a.get("index", 0)), OPS[a["op"]],
                             int(a.get("value", 0)), int(a.get("valueTwo", 0))))
    indexes = [c.arg for c in conds]
    if len(set(indexes)) < len(indexes):
        return [[c] for c in conds]
    return [conds]


def compile_profile(seccomp: dict[str, Any]) -> bytes:
    """The BPF program (struct sock_filter array) libseccomp makes of `seccomp`."""
    lib = _lib()
    default = _action(seccomp.get("defaultAction"), seccomp.get("defaultErrnoRet"))
    ctx = lib.seccomp_init(default)
    if not ctx:
        raise InvalidArgument("seccomp: libseccomp refused the default action")
    try:
        for arch in seccomp.get("architectures") or []:
            token = lib.seccomp_arch_resolve_name(
                str(arch).removeprefix("SCMP_ARCH_").lower().encode())
            rc = lib.seccomp_arch_add(ctx, token) if token else -errno.EINVAL
            if rc not in (0, -errno.EEXIST):
                raise InvalidArgument(f"seccomp: architecture {str(arch)[:32]!r} is unknown")
        for rule in seccomp.get("syscalls") or []:
            action = _action(rule.get("action"), rule.get("errnoRet"))
            if action == default:
                continue
            for name in rule.get("names") or []:
                nr = lib.seccomp_syscall_resolve_name(str(name).encode())
                if nr == NR_ERROR:
                    continue
                for conds in _conditions(rule.get("args") or []):
                    array = (_ArgCmp * len(conds))(*conds)
                    rc = lib.seccomp_rule_add_array(ctx, action, nr, len(conds), array)
                    if rc < 0:
                        raise InvalidArgument(f"seccomp: libseccomp refused the rule for "
                                              f"{str(name)[:64]}: {os.strerror(-rc)}")
        return _export(lib, ctx)
    finally:
        lib.seccomp_release(ctx)


def _export(lib: ctypes.CDLL, ctx: int) -> bytes:
    fd = os.memfd_create("pycri-seccomp-bpf", os.MFD_CLOEXEC)
    try:
        rc = lib.seccomp_export_bpf(ctx, fd)
        if rc < 0:
            raise InvalidArgument(f"seccomp: libseccomp could not export the filter: "
                                  f"{os.strerror(-rc)}")
        size = os.lseek(fd, 0, os.SEEK_END)
        if size > MAX_BPF:
            raise InvalidArgument("seccomp: the compiled filter is too large")
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def syscall_name(arch: int, nr: int) -> str:
    """`nr`'s name on the audit architecture `arch`, or the number where unknown."""
    if arch == X86_64 and nr & X32_BIT:
        return f"{syscall_name(X32, nr)} (x32)"
    try:
        lib = _lib()
    except Unavailable:
        return f"syscall {nr}"
    ptr = lib.seccomp_syscall_resolve_num_arch(arch, nr)
    if not ptr:
        return f"syscall {nr}"
    try:
        return ctypes.string_at(ptr).decode(errors="replace")[:64]
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(ptr))
