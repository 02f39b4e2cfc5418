"""Domain errors. The gRPC layer (pycri/server/errors.py) maps each to a status code.

Domain code raises these and never imports grpc, so it stays testable on its own;
`step` names the step of a multi-step RPC an error happened in.
"""

from __future__ import annotations

import contextlib
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


class ResourceExhausted(PycriError):
    """The node ran out of something the request needs (disk space, a bounded budget)."""


class Unavailable(PycriError):
    """A dependency (registry, CNI, runtime) could not be reached in time."""


class DeadlineExceeded(PycriError):
    """An operation ran past its own timeout."""


class Unimplemented(PycriError):
    """A feature pycri does not have (clients such as critest skip on this code)."""


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
        raise PycriError(f"{what}: {e}") from e
