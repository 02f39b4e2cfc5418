"""Translate domain errors into gRPC status codes, in one place.

Servicer methods are wrapped with `@rpc`; a domain error becomes the status
the kubelet expects, and anything unexpected becomes INTERNAL with the
exception logged, never a crashed call or a dead server.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from pycri import errors, metrics
from pycri.api import api_pb2 as pb
from pycri.gate import check_request
from pycri.image.auth import Secret
from pycri.server import oplog

log = logging.getLogger("pycri.rpc")

CODES: dict[type[errors.PycriError], grpc.StatusCode] = {
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.Unimplemented: grpc.StatusCode.UNIMPLEMENTED,
}

R = TypeVar("R")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]

# State-changing calls that end with their client instead of finishing alone. A pull
# holds registry connections for as long as a registry cares to send and leaves nothing
# half-done (ImageManager.pull drops what it fetched; a second client waiting for the
# same image keeps the shared pull alive), so it ends when its client goes.
ENDS_WITH_CLIENT = frozenset({"PullImage"})


def status_code(exc: errors.PycriError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in CODES:
            return CODES[cls]
    return grpc.StatusCode.UNKNOWN


def rpc(fn: Handler[R], /) -> Handler[R]:
    """Wrap a servicer method: validate the request, map domain errors to codes, time it
    (metrics.py) and log a state-changing call's outcome (oplog.py).

    A call that changes state runs shielded from its caller: a client that gives up
    (deadline, ^C) cancels only its wait, never a StopPodSandbox or CreateContainer
    half-way, which would leave a lease, a mount or a process behind. A read-only call
    (oplog.changes_state: List*, *Status, *Stats, ExecSync, ...) has nothing to finish:
    it runs inline, in the caller's task, so the client's cancel reaches it (ExecSync
    undoes what it started) and the hot read path costs no extra task and no extra
    turns of the event loop, behind whatever else is ready to run. A call in
    ENDS_WITH_CLIENT runs shielded too (it is logged), but is cancelled with its client.
    """
    name = fn.__name__
    latency = metrics.RPC_SECONDS.labels(name)  # resolved once, not per call
    audited = oplog.changes_state(name)
    finishes_alone = name not in ENDS_WITH_CLIENT

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        t0 = time.perf_counter()
        if log.isEnabledFor(logging.DEBUG):  # the request's text is costly to build
            log.debug("%s %s", name, _short(request))
        subject = oplog.subject(self, request) if audited else None
        code, error, response = "OK", "", None
        work = asyncio.ensure_future(checked(fn, self, request, context)) if audited else None
        seconds: float | None = None

        def observe() -> float:
            """Latency and error count, once: before an abort, which the client hears
            at once, so a scrape after its answer counts the call."""
            nonlocal seconds
            if seconds is None:
                seconds = time.perf_counter() - t0
                latency.observe(seconds)
                if code != "OK":
                    metrics.RPC_ERRORS.labels(name, code).inc()
            return seconds

        try:
            if work is None:
                response = await checked(fn, self, request, context)
            else:
                response = await asyncio.shield(work)
            return response
        except asyncio.CancelledError:
            code, error = "CANCELLED", "the client went away"
            if work is not None and not work.done():
                if finishes_alone:
                    log.info("%s: the client went away; finishing the call anyway", name)
                    work.add_done_callback(functools.partial(_finished_alone, name))
                else:
                    work.cancel()
            raise
        except grpc.aio.AbortError:  # the handler aborted with its own code
            aborted = context.code()
            code = aborted.name if isinstance(aborted, grpc.StatusCode) else "UNKNOWN"
            raise
        except Exception as e:
            code, error = _outcome(e)
            observe()
            await _abort(name, e, context, quiet=audited)  # oplog's line says it all
        finally:
            took = observe()
            if subject is not None:
                oplog.done(name, subject, response, took, code, error)
        raise AssertionError("unreachable")  # pragma: no cover - abort always raises

    return wrapper


StreamHandler = Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[R]]


def stream_rpc(fn: StreamHandler[R]) -> StreamHandler[R]:
    """`@rpc` for a server-streaming method: the same gate, log line and error mapping.
    Nothing to shield: a streamed list has no work left to finish when its client goes."""
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[R]:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s", name, _short(request))
        try:
            check_request(request)
            async for msg in fn(self, request, context):
                yield msg
        except grpc.aio.AbortError:
            raise
        except Exception as e:
            await _abort(name, e, context)

    return wrapper


def _domain(e: Exception) -> Exception:
    """A failing filesystem outside any step is still the node's condition, not a bug."""
    fault = errors.host_fault(e) if isinstance(e, OSError) else None
    return fault if fault is not None else e


def _outcome(e: Exception) -> tuple[str, str]:
    """The gRPC code name and message a failed call ends with."""
    e = _domain(e)
    if isinstance(e, errors.PycriError):
        return status_code(e).name, str(e)
    return "INTERNAL", f"{type(e).__name__}: {e}"


async def _abort(name: str, e: Exception, context: grpc.aio.ServicerContext,
                 quiet: bool = False) -> None:  # fmt: skip
    """End the call with the status of `e`: its code for a domain error, else INTERNAL.
    `quiet`: the domain error is logged by the caller (an unexpected one always is)."""
    e = _domain(e)
    if isinstance(e, errors.PycriError):
        if not quiet:
            log.info("%s failed: %s", name, e)
        await context.abort(status_code(e), str(e))
    log.exception("%s: unexpected error", name)
    await context.abort(grpc.StatusCode.INTERNAL, f"{name}: {type(e).__name__}: {e}")


async def checked(fn: Handler[R], self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
    """Run a handler once its request has passed the validation gate (gate.py)."""
    check_request(request)
    return await fn(self, request, context)


def _finished_alone(name: str, work: asyncio.Future[Any]) -> None:
    """Report the outcome of a call its client stopped waiting for."""
    if work.cancelled():
        return
    if (e := work.exception()) is not None:
        log.info("%s (client gone) failed: %s", name, e)


def _short(request: Any) -> str:
    text = str(_shown(request)).replace("\n", " ")
    return text if len(text) <= 300 else text[:300] + "…"


_CREDENTIALS = ("password", "auth", "identity_token", "registry_token")
REDACTED = Secret.SHOWN


def _shown(request: Any) -> Any:
    """The request as a debug line shows it: a PullImage's credentials and a container's
    env values (a Secret's, often) as <redacted> (issue 39)."""
    if isinstance(request, pb.PullImageRequest) and request.HasField("auth"):
        shown = pb.PullImageRequest()
        shown.CopyFrom(request)
        for name in _CREDENTIALS:
            if getattr(shown.auth, name):
                setattr(shown.auth, name, REDACTED)
        return shown
    if isinstance(request, pb.CreateContainerRequest) and request.config.envs:
        create = pb.CreateContainerRequest()
        create.CopyFrom(request)
        for kv in create.config.envs:
            kv.value = REDACTED.encode()
        return create
    return request
