"""The CRI streaming server: Exec, Attach and PortForward over SPDY/3.1 or WebSocket upgrades."""

from pycri.streaming.backend import RuntimeBackend
from pycri.streaming.server import (
    AttachRequest,
    ExecRequest,
    PortForwardRequest,
    StreamingServer,
)

__all__ = [
    "AttachRequest",
    "ExecRequest",
    "PortForwardRequest",
    "RuntimeBackend",
    "StreamingServer",
]
