"""The cAdvisor door: the three containerd calls cAdvisor's containerd plugin makes,
answered from pycri's records on a socket of pycri's own.

- `containerd.services.version.v1.Version/Version`: asked once, when the kubelet starts
  (no answer then, and its cAdvisor never asks again: pycri must be up first).
- `containerd.services.containers.v1.Containers/Get`: for each new cgroup whose name
  holds a 64-character ID, and again when cAdvisor makes its handler.
- `containerd.services.tasks.v1.Tasks/Get`: the pid cAdvisor reads the network stats
  through (the pod's infra is the sandbox's task).

Every other method is UNIMPLEMENTED (gRPC's answer for an unregistered one). The door
reads the same records as the CRI and keeps nothing of its own. It is root-only: its
socket sits in a 0700 directory, and a symlink at cAdvisor's default path (only where
no containerd serves that path) leads there. Requests are bounded: a few KiB each, a
fixed number in flight (more are RESOURCE_EXHAUSTED), spec files read up to a cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2

from pycri import __version__, boundedjson
from pycri.cadvisor import view
from pycri.cadvisor.api import containerd_pb2 as ctrd
from pycri.config import CadvisorConfig
from pycri.errors import NotFound
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox

log = logging.getLogger(__name__)

NAMESPACE_HEADER = "containerd-namespace"
# A Get carries an ID (containerd's are at most 76 characters): 4 KiB is generous.
MAX_REQUEST = 4096
MAX_METADATA = 16 * 1024
# A spec larger than this is answered as `{}`: cAdvisor reads only process.env from it,
# and only for variables an operator allow-listed, which the kubelet never does.
MAX_SPEC = 1 << 20
EMPTY_SPEC = b"{}"
# What cAdvisor's client takes in one answer: a spec plus the labels a CRI request set.
MAX_ANSWER = 16 * 1024 * 1024
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
MAX_ID = 76


@dataclass
class Sources:
    """What the door reads, all of it the daemon's own: the record maps (exact IDs),
    image names by image ID, and where an object's OCI spec is."""

    sandboxes: Mapping[str, Sandbox]
    containers: Mapping[str, Container]
    image_name: Callable[[str, str], str]  # (image ID, fallback) -> a tag, as people read it
    spec_path: Callable[[str], Path]
    pause_image: Callable[[], str]  # the sandbox's image ("" for the built-in infra)


def read_spec(path: Path) -> bytes:
    """The object's config.json, as written: a regular file read without following a
    link or blocking, at most MAX_SPEC bytes; `{}` when there is none or it is larger."""
    try:
        data = boundedjson.read_file(path, MAX_SPEC)
    except OSError:
        return EMPTY_SPEC
    return data or EMPTY_SPEC


def _valid_id(oid: str) -> bool:
    return 0 < len(oid) <= MAX_ID and set(oid) <= _ID_CHARS


class Door:
    """The door's answers; `serve` puts them on a socket."""

    def __init__(self, sources: Sources) -> None:
        self.src = sources

    async def _namespace(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """containerd's rule: a namespaced call names its namespace. Only `k8s.io` holds
        anything; in any other the lookup finds nothing."""
        ns = dict(context.invocation_metadata() or ()).get(NAMESPACE_HEADER)
        if not ns:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "namespace is required: set the containerd-namespace header")
        return str(ns)

    def _lookup(self, oid: str, ns: str) -> Sandbox | Container:
        if ns == view.NAMESPACE and _valid_id(oid):
            found = self.src.sandboxes.get(oid) or self.src.containers.get(oid)
            if found is not None:
                return found
        raise NotFound(f"container {oid[:MAX_ID]!r} in namespace {ns[:64]!r}: not found")

    async def get_container(self, request: ctrd.GetContainerRequest,
                            context: grpc.aio.ServicerContext[Any, Any]
                            ) -> ctrd.GetContainerResponse:  # fmt: skip
        ns = await self._namespace(context)
        try:
            obj = self._lookup(request.id, ns)
        except NotFound as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        spec = await asyncio.to_thread(read_spec, self.src.spec_path(obj.id))
        if isinstance(obj, Sandbox):
            return ctrd.GetContainerResponse(
                container=view.of_sandbox(obj, self.src.pause_image(), spec))
        image = self.src.image_name(obj.image_id, obj.config.image.image)
        return ctrd.GetContainerResponse(container=view.of_container(obj, image, spec))

    async def get_task(self, request: ctrd.GetTaskRequest,
                       context: grpc.aio.ServicerContext[Any, Any]) -> ctrd.GetTaskResponse:
        ns = await self._namespace(context)
        try:
            obj = self._lookup(request.container_id, ns)
            if request.exec_id:  # execs are not tasks cAdvisor reads
                raise NotFound(f"process {request.exec_id[:MAX_ID]!r}: not found")
            task = (view.sandbox_task(obj) if isinstance(obj, Sandbox)
                    else view.container_task(obj))
        except NotFound as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        return ctrd.GetTaskResponse(process=view.process(obj.id, task))

    async def version(self, request: empty_pb2.Empty,
                      context: grpc.aio.ServicerContext[Any, Any]) -> ctrd.VersionResponse:
        return ctrd.VersionResponse(version=f"pycri-{__version__}")

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        def unary(fn: Any, req: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=req.FromString,
                response_serializer=lambda m: m.SerializeToString())
        return [
            grpc.method_handlers_generic_handler(
                "containerd.services.containers.v1.Containers",
                {"Get": unary(self.get_container, ctrd.GetContainerRequest)}),
            grpc.method_handlers_generic_handler(
                "containerd.services.tasks.v1.Tasks",
                {"Get": unary(self.get_task, ctrd.GetTaskRequest)}),
            grpc.method_handlers_generic_handler(
                "containerd.services.version.v1.Version",
                {"Version": unary(self.version, empty_pb2.Empty)}),
        ]


@dataclass(frozen=True)
class Claim:
    """cAdvisor's default path, linked to the door: the link, and the directory made
    for it (None when it was there already)."""

    link: Path
    target: Path
    made_dir: Path | None


# Who holds cAdvisor's default path (`holder`).
FREE, DOOR, SERVED, DEAD, OTHER = "free", "door", "served", "dead", "other"


def holder(path: Path, target: Path) -> str:
    """FREE (nothing there), DOOR (our link to `target`), SERVED (a socket, or a link to
    one, that answers: a containerd), DEAD (a socket or link nothing answers: what a
    crashed containerd or pycri left) or OTHER (any other file)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return FREE
    if stat.S_ISLNK(st.st_mode) and os.readlink(path) == str(target):
        return DOOR
    if not stat.S_ISLNK(st.st_mode) and not stat.S_ISSOCK(st.st_mode):
        return OTHER
    return SERVED if answers(path) else DEAD


def claim_default(path: Path, target: Path) -> Claim | None:
    """Point cAdvisor's default path at `target` by a symlink, unless something else
    has it: a live socket (a containerd), or any file that is not a socket or our own
    link. A dead socket or a dangling link (a crashed containerd or pycri) is replaced."""
    held = holder(path, target)
    if held == SERVED:
        log.warning("cadvisor: %s is served (a containerd?); the kubelet needs "
                    "--containerd=%s to see pycri's containers", path, target)
        return None
    if held == OTHER:
        log.info("cadvisor: %s is not a socket; leaving it", path)
        return None
    if held != FREE:
        path.unlink()
    made = None if path.parent.exists() else path.parent
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    os.symlink(target, path)
    return Claim(path, target, made)


def release_default(claim: Claim) -> None:
    """Remove the symlink `claim_default` made if it is still ours, and the directory
    made for it if nothing else is in it now."""
    try:
        if os.readlink(claim.link) == str(claim.target):
            claim.link.unlink()
    except OSError:
        pass
    if claim.made_dir is not None:
        with contextlib.suppress(OSError):  # not empty: a containerd moved in
            claim.made_dir.rmdir()


def answers(path: Path) -> bool:
    """Whether a process accepts connections on the socket at `path`."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError as e:
        return e.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK)
    finally:
        probe.close()
    return True


async def serve(door: Door, cfg: CadvisorConfig, sock: Path) -> grpc.aio.Server:
    """The door's own gRPC server on `sock` (in a 0700 directory made here), with the
    per-request bounds above; the caller stops it."""
    sock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(sock.parent, 0o700)
    if os.path.lexists(sock) and answers(sock):
        raise OSError(errno.EADDRINUSE, f"{sock} is served by another process")
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_REQUEST),
            ("grpc.max_send_message_length", MAX_ANSWER),
            ("grpc.max_metadata_size", MAX_METADATA),
        ],
        maximum_concurrent_rpcs=cfg.max_concurrent_calls,
        handlers=door.handlers(),
    )
    if server.add_insecure_port(f"unix:{sock}") == 0:
        raise OSError(errno.EADDRNOTAVAIL, f"cannot listen on {sock}")
    os.chmod(sock, 0o600)
    await server.start()
    return server


