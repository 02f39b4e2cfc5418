"""The seccomp filters a live process runs under, read as CRIU reads them when it dumps
(ptrace's PTRACE_SECCOMP_GET_FILTER, newest first), so that tests can build the
seccomp.img a real checkpoint of that process would hold on hosts where CRIU cannot dump.
Root only; the process is stopped for the read and let go after it."""

from __future__ import annotations

import ctypes
import errno
import os

PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4206, 0x4207
PTRACE_SECCOMP_GET_FILTER = 0x420C
WALL = 0x40000000  # __WALL: wait for a tracee that is not our child


def installed(pid: int) -> list[bytes]:
    """`pid`'s filters, newest first: each a struct sock_filter array."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]

    def call(request: int, addr: int = 0, data: ctypes.Array | None = None) -> int:  # type: ignore[type-arg]
        rc = int(libc.ptrace(request, pid, addr, data))
        if rc < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"ptrace({request:#x}) on {pid}: {os.strerror(e)}")
        return rc

    call(PTRACE_SEIZE)
    try:
        call(PTRACE_INTERRUPT)
        os.waitpid(pid, WALL)
        out = []
        while True:
            try:
                count = call(PTRACE_SECCOMP_GET_FILTER, len(out))
            except OSError as e:
                if e.errno == errno.ENOENT:
                    return out
                raise
            buf = ctypes.create_string_buffer(count * 8)
            call(PTRACE_SECCOMP_GET_FILTER, len(out), buf)
            out.append(buf.raw)
    finally:
        libc.ptrace(PTRACE_DETACH, pid, 0, 0)
