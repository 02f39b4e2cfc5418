"""The streaming server's view of pycri: check requests, then exec, attach or dial.

Checks run when the RPC is made (so the kubelet gets NotFound/FailedPrecondition
right away) and the container or pod is looked up again on connect, since it may
have changed in between.
"""

from __future__ import annotations

import socket
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.container.manager import ContainerManager
from pycri.errors import FailedPrecondition, InvalidArgument, NotFound
from pycri.launcher import Launcher
from pycri.sandbox.manager import SandboxManager
from pycri.store.container import Container
from pycri.streaming import attach, dial, process
from pycri.streaming.remotecommand import StreamIO
from pycri.streaming.server import AttachRequest, ExecRequest, PortForwardRequest


def _check_streams(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> None:
    if not (stdin or stdout or stderr):
        raise InvalidArgument("one of stdin, stdout and stderr must be requested")
    if tty and stderr:
        raise InvalidArgument("tty and stderr cannot both be true (a terminal has one output)")


class RuntimeBackend:
    def __init__(
        self, containers: ContainerManager, sandboxes: SandboxManager, launcher: Launcher
    ) -> None:
        self.containers = containers
        self.sandboxes = sandboxes
        self.launcher = launcher

    def _running(self, cid: str) -> Container:
        c = self.containers.get(cid)
        if c.state != pb.CONTAINER_RUNNING:
            state = pb.ContainerState.Name(c.state)
            raise FailedPrecondition(f"container {c.id} is {state}, not RUNNING")
        return c

    # -- checks at RPC time ------------------------------------------------------------

    def check_exec(self, req: ExecRequest) -> ExecRequest:
        if not req.cmd:
            raise InvalidArgument("exec needs a command")
        _check_streams(req.stdin, req.stdout, req.stderr, req.tty)
        c = self._running(req.container_id)
        return ExecRequest(c.id, list(req.cmd), req.tty, req.stdin, req.stdout, req.stderr)

    def check_attach(self, req: AttachRequest) -> AttachRequest:
        _check_streams(req.stdin, req.stdout, req.stderr, req.tty)
        c = self._running(req.container_id)
        return AttachRequest(c.id, req.tty, req.stdin, req.stdout, req.stderr)

    def check_port_forward(self, req: PortForwardRequest) -> PortForwardRequest:
        sb = self.sandboxes.get(req.sandbox_id)
        if sb.state != pb.SANDBOX_READY:
            raise FailedPrecondition(f"pod sandbox {sb.id} is not ready")
        for port in req.ports:
            if not 0 < port < 65536:
                raise InvalidArgument(f"invalid port {port}")
        return PortForwardRequest(sb.id, list(req.ports))

    # -- work on connect ---------------------------------------------------------------

    async def exec(self, req: ExecRequest, io: StreamIO) -> int:
        c = self._running(req.container_id)
        spec: dict[str, Any] | None = self.launcher.spec(c.id)
        if spec is None or "process" not in spec:
            raise NotFound(f"the OCI spec of container {c.id} is gone")
        runtime = self.launcher.runtime(c.handler)
        return await process.exec_streaming(runtime, c.id, spec["process"], req.cmd, io,
                                             self.launcher.reaper)

    async def attach(self, req: AttachRequest, io: StreamIO) -> int:
        c = self._running(req.container_id)
        bundle = self.launcher.bundle_dir(c.id)
        return await attach.attach(bundle, io, stdin_once=c.config.stdin_once)

    async def dial(self, sandbox_id: str, port: int) -> socket.socket:
        sb = self.sandboxes.get(sandbox_id)
        if sb.state != pb.SANDBOX_READY:
            raise FailedPrecondition(f"pod sandbox {sb.id} is not ready")
        return await dial.dial(sb.netns or None, port)
