"""Fill in every RPC a servicer does not define with an UNIMPLEMENTED answer.

The generated base classes answer "Method not implemented!"; a node operator
reading crictl's output needs to know *which* RPC pycri lacks.
"""

from __future__ import annotations

from typing import Any, TypeVar

import grpc

T = TypeVar("T", bound=type)


def _unimplemented(service: str, name: str) -> Any:
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, f"{service}/{name} is not implemented by pycri"
        )

    handler.__name__ = name
    return handler


def complete(service: str, base: type) -> Any:
    """Class decorator: RPCs of `base` not overridden answer UNIMPLEMENTED, named."""

    def wrap(cls: T) -> T:
        for name, attr in vars(base).items():
            if name.startswith("_") or not callable(attr):
                continue
            if getattr(cls, name) is attr:
                setattr(cls, name, _unimplemented(service, name))
        return cls

    return wrap
