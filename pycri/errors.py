"""Domain errors. The gRPC layer (pycri/server/errors.py) maps each to a status code.

Domain code raises these and never imports grpc, so it stays testable on its own.
"""


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
