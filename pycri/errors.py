"""Domain errors. The gRPC layer (pycri/server/errors.py) maps each to a status code.

Domain code raises these and never imports grpc, so it stays testable on its own;
`step` names the step of a multi-step RPC an error happened in, and `host_fault` says
which domain error a failing filesystem is.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import AsyncIterator


class PycriError(Exception):
    """Base of every error pycri reports to a CRI client."""


class NotFound(PycriError):
    """An ID or reference names nothing that exists."""


class AlreadyExists(PycriError):
    """A name is reserved by another object (pods and containers)."""


class InvalidArgument(PycriError):
    """The request itself is wrong; nothing was changed."""


class FailedPrecondition(PycriError):
    """The request is well-formed but the object's state forbids it."""


class PermissionDenied(PycriError):
    """A party pycri asked on the caller's behalf (a registry) refused it."""


class ResourceExhausted(PycriError):
    """The node ran out of something the request needs (disk space, a bounded budget)."""


class Unavailable(PycriError):
    """A dependency (registry, CNI, runtime) could not be reached in time."""


class DeadlineExceeded(PycriError):
    """An operation ran past its own timeout."""


class Unimplemented(PycriError):
    """A feature pycri does not have (clients such as critest skip on this code)."""


# A filesystem that is full, over quota, read-only or failing is the node's condition,
# not a bug: the client hears a code it can act on and which filesystem (issue 38).
_FS_FAULTS: dict[int, tuple[type[PycriError], str]] = {
    errno.ENOSPC: (ResourceExhausted, "no space left on"),
    errno.EDQUOT: (ResourceExhausted, "disk quota exceeded on"),
    errno.EROFS: (FailedPrecondition, "read-only:"),
    errno.EIO: (Unavailable, "I/O error on"),
}


def host_fault(e: OSError, path: str | os.PathLike[str] | None = None) -> PycriError | None:
    """The domain error of a filesystem fault, naming the filesystem of `path` (else the
    file the error names); None for any other error."""
    fault = _FS_FAULTS.get(e.errno or 0)
    if fault is None:
        return None
    cls, what = fault
    where = path if path is not None else e.filename
    if isinstance(where, (str, os.PathLike)) and str(where):
        return cls(f"{what} {filesystem(where)}")
    return cls(f"{what} a filesystem of the node ({e.strerror})")


def filesystem(path: str | os.PathLike[str]) -> str:
    """'the filesystem mounted at M': the mount point holding `path` (or its nearest
    existing ancestor), found by device number."""
    p = os.path.abspath(path)
    try:
        while not os.path.lexists(p) and p != "/":
            p = os.path.dirname(p)
        dev = os.lstat(p).st_dev
        while p != "/" and os.lstat(os.path.dirname(p)).st_dev == dev:
            p = os.path.dirname(p)
    except OSError:
        return f"the filesystem holding {os.fspath(path)}"
    return f"the filesystem mounted at {p}"


@contextlib.asynccontextmanager
async def step(what: str) -> AsyncIterator[None]:
    """Prefix a failure with the step it happened in, keeping its status code: the
    error is re-raised as its nearest class from this module (whose constructors all
    take just a message)."""
    try:
        yield
    except PycriError as e:
        kind = next(c for c in type(e).__mro__ if c.__module__ == __name__)
        raise kind(f"{what}: {e}") from e
    except OSError as e:
        fault = host_fault(e)
        raise (type(fault) if fault else PycriError)(f"{what}: {fault or e}") from e
