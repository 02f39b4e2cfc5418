"""Structured CRI fuzzing against a live `pycri serve`, shared by tests/e2e/test_fuzz.py
and hack/fuzz.py.

Requests are generated from the proto descriptors with hypothesis: every field type,
nested messages, maps, repeated fields, enums with unknown values, hostile strings and
integers at their bounds. Most requests start from a valid one (a pod that would run, a
container that would start, the IDs of objects that exist) with one to three fields
mutated, so the fuzzer gets past the first check and into the managers.

Nothing generated may touch the host outside a per-run scratch dir (the canary): every
request goes through `confine()` before it is sent, which pins host paths, log paths and
seccomp profiles under the canary, image references to the loopback registry, commands to
harmless busybox applets, cgroup v2 keys to a safe list and host ports to 30000-30999.

The oracle (`Fuzzer.call`, `Fuzzer.check_alive`, `Fuzzer.leaks`): no INTERNAL or UNKNOWN
status, every call answers within its deadline, the daemon answers Version within 1 s
after every batch, and after everything is removed nothing is left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import re
import signal
import sqlite3
import stat
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from pycri.api import api_pb2 as pb
from tests.conftest import NO_DEFAULT_CADVISOR, PycriProcess

# --- the RPCs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    name: str
    path: str
    request: type[Message]
    response: type[Message]
    streaming: bool


def _methods() -> dict[str, Method]:
    out = {}
    for service in pb.DESCRIPTOR.services_by_name.values():
        for m in service.methods:
            out[m.name] = Method(
                name=m.name,
                path=f"/{service.full_name}/{m.name}",
                request=message_factory.GetMessageClass(m.input_type),
                response=message_factory.GetMessageClass(m.output_type),
                streaming=m.server_streaming,
            )
    return out


METHODS = _methods()
# RPCs that create or destroy real things (netns, mounts, processes) are drawn more often.
WEIGHTS = {"RunPodSandbox": 6, "CreateContainer": 8, "StartContainer": 6, "StopContainer": 3,
           "RemoveContainer": 3, "StopPodSandbox": 2, "RemovePodSandbox": 2, "ExecSync": 4,
           "PullImage": 2, "UpdateContainerResources": 2, "UpdatePodSandboxResources": 2}
# Calls that may legitimately wait (runtime, CNI, registry); everything else is quick.
SLOW = {"RunPodSandbox", "CreateContainer", "StartContainer", "StopContainer",
        "RemoveContainer", "StopPodSandbox", "RemovePodSandbox", "ExecSync", "PullImage",
        "RemoveImage", "UpdateContainerResources", "UpdatePodSandboxResources",
        "CheckpointContainer", "CheckpointPod", "RestorePod"}
BAD_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}

# --- hostile values ---------------------------------------------------------------------

LONG = [63, 64, 65, 253, 254, 255, 256, 4096, 65536, 1 << 20]
TRICKS = [
    "", " ", "\x00", "a\x00b", "\n", "a\nb", "\r\n", "\t", "\x1b[2J", "\x7f", "\x01\x02",
    ".", "..", "../", "../../../../../etc/passwd", "/", "//", "/etc/passwd", "/proc/self/root",
    "a/b", "a/../b", "-", "--help", "-rf", "*", "?", "%s%n%x", "${HOME}", "$(id)", "`id`",
    "'", '"', "\\", ":", "@", "#", "a b", "é", "日本語", "\u202e", "\ufeff", "\U0001f980",
    # what make_canary() puts under allowed/, where host paths are pinned
    "vol", "vol/file", "profile.json", "fifo", "null", "logs",
]
INT_BOUNDS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
MAX_DEPTH = 3


@dataclass
class Pool:
    """What exists on the daemon, so requests can name real objects."""

    image: str
    registry: str
    canary: Path
    pods: dict[str, pb.PodSandboxConfig] = field(default_factory=dict)
    containers: dict[str, str] = field(default_factory=dict)  # id -> pod id
    states: dict[str, int] = field(default_factory=dict)  # id -> pb.ContainerState
    ready: set[str] = field(default_factory=set)  # pods in SANDBOX_READY
    image_ids: list[str] = field(default_factory=list)
    prefix: str = "fz"
    seq: int = 0
    strategies: dict[Any, st.SearchStrategy[Any]] = field(default_factory=dict, repr=False)

    def cached(self, key: Any, make: Callable[[], st.SearchStrategy[Any]]) -> (
            st.SearchStrategy[Any]):
        """Strategies are built once per run: building them costs more than drawing."""
        if key not in self.strategies:
            self.strategies[key] = make()
        return self.strategies[key]

    @property
    def allowed(self) -> Path:
        return self.canary / "allowed"

    @property
    def protected(self) -> Path:
        return self.canary / "protected"

    def in_state(self, state: int) -> list[str]:
        return [c for c in self.containers if self.states.get(c) == state]

    def ids(self) -> list[str]:
        return [*self.pods, *self.containers, *self.image_ids]

    def next_name(self) -> str:
        self.seq += 1
        return f"{self.prefix}{self.seq}"


def pick(items: Callable[[], list[str]]) -> st.SearchStrategy[str]:
    """One of `items()` at the time of drawing ("" if none). The draw itself is a plain
    integer, so what hypothesis records does not depend on the daemon's state."""
    def resolve(i: int) -> str:
        got = items()
        return got[i % len(got)] if got else ""
    return st.integers(0, 2**16).map(resolve)


def strings(pool: Pool) -> st.SearchStrategy[str]:
    """Short text, tricks, long runs, and (prefixes of) IDs that exist."""
    return pool.cached("strings", lambda: st.one_of(
        st.text(max_size=12),
        st.sampled_from(TRICKS),
        st.builds(lambda c, n: c * n, st.sampled_from("aZ9-./\x00é"), st.sampled_from(LONG)),
        pick(pool.ids),
        pick(pool.ids).map(lambda i: i[:6]),
    ))


def scalar(f: FieldDescriptor, pool: Pool) -> st.SearchStrategy[Any]:
    t = f.type
    if t == FieldDescriptor.TYPE_STRING:
        return strings(pool)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=32), st.just(b"\x00" * 65536))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in f.enum_type.values]
        return st.one_of(st.sampled_from(known), st.sampled_from([-1, 99, 2**31 - 1]))
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(width=32 if t == FieldDescriptor.TYPE_FLOAT else 64)
    lo, hi = INT_BOUNDS[t]
    edges = sorted({lo, hi, 0, 1, max(lo, -1), 255, 256, 1024, 65535, 65536, hi // 2}
                   & set(range(lo, hi + 1)) if hi < 2**20 else
                   {v for v in (lo, hi, 0, 1, -1, 255, 256, 1024, 65535, 65536, 2**31 - 1,
                                2**31, 2**32, hi // 2) if lo <= v <= hi})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def is_map(f: FieldDescriptor) -> bool:
    return f.message_type is not None and f.message_type.GetOptions().map_entry


def value(f: FieldDescriptor, pool: Pool, depth: int) -> st.SearchStrategy[Any]:
    """A value for field `f` (a list for repeated fields, a dict for maps)."""
    return pool.cached(("value", f.full_name, depth), lambda: _value(f, pool, depth))


def _value(f: FieldDescriptor, pool: Pool, depth: int) -> st.SearchStrategy[Any]:
    if is_map(f):
        k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        # not st.dictionaries: its unique keys would make the number of draws depend on
        # which IDs exist, and hypothesis refuses a strategy that draws inconsistently
        return st.lists(st.tuples(scalar(k, pool), single(v, pool, depth)),
                        max_size=3).map(dict)
    if f.is_repeated:
        return st.lists(single(f, pool, depth), max_size=2)
    return single(f, pool, depth)


def single(f: FieldDescriptor, pool: Pool, depth: int) -> st.SearchStrategy[Any]:
    if f.message_type is not None:
        return message(f.message_type, pool, depth + 1)
    return scalar(f, pool)


def message(desc: Descriptor, pool: Pool, depth: int = 0) -> st.SearchStrategy[Message]:
    """A random message of type `desc`: each field set or not, recursion bounded."""
    cls = message_factory.GetMessageClass(desc)
    if depth >= MAX_DEPTH or not desc.fields:
        return st.builds(cls)

    def make() -> st.SearchStrategy[Message]:
        fields = {f.name: st.one_of(st.none(), value(f, pool, depth)) for f in desc.fields}
        return st.fixed_dictionaries(fields).map(lambda vals: build(cls, vals))
    return pool.cached(("message", desc.full_name, depth), make)


def build(cls: type[Message], vals: dict[str, Any]) -> Message:
    msg = cls()
    for name, v in vals.items():
        if v is not None:
            assign(msg, msg.DESCRIPTOR.fields_by_name[name], v)
    return msg


def assign(msg: Message, f: FieldDescriptor, v: Any) -> None:
    """Set field `f` of `msg` to `v`, whatever kind of field it is."""
    if is_map(f):
        target = getattr(msg, f.name)
        target.clear()
        for k, item in v.items():
            if isinstance(item, Message):
                target[k].CopyFrom(item)
            else:
                target[k] = item
    elif f.is_repeated:
        target = getattr(msg, f.name)
        del target[:]
        if f.message_type is not None:
            for item in v:
                target.add().CopyFrom(item)
        else:
            target.extend(v)
    elif f.message_type is not None:
        getattr(msg, f.name).CopyFrom(v)
    else:
        setattr(msg, f.name, v)


def field_paths(desc: Descriptor, depth: int = 0) -> list[tuple[FieldDescriptor, ...]]:
    """Every field reachable from `desc` (through singular and repeated messages)."""
    out: list[tuple[FieldDescriptor, ...]] = []
    for f in desc.fields:
        out.append((f,))
        if f.message_type is not None and not is_map(f) and depth < MAX_DEPTH:
            out += [(f, *rest) for rest in field_paths(f.message_type, depth + 1)]
    return out


_PATHS: dict[str, list[tuple[FieldDescriptor, ...]]] = {}


def set_path(msg: Message, path: tuple[FieldDescriptor, ...], v: Any) -> None:
    for f in path[:-1]:
        msg = getattr(msg, f.name)
        if f.is_repeated:
            msg = msg[0] if len(msg) else msg.add()
    assign(msg, path[-1], v)


@dataclass
class Request:
    """One generated request and how it was made (for the reproducer)."""

    method: Method
    msg: Message
    how: str


def mutated(base: Message, pool: Pool) -> st.SearchStrategy[tuple[Message, str]]:
    """`base` with one to three fields (anywhere in the tree) replaced by hostile values."""
    name = base.DESCRIPTOR.full_name
    paths = _PATHS.setdefault(name, field_paths(base.DESCRIPTOR))
    if not paths:
        return st.just((base, "nothing (no fields)"))

    def one(path: tuple[FieldDescriptor, ...]) -> st.SearchStrategy[tuple[Any, Any]]:
        return pool.cached(("path", *(f.full_name for f in path)), lambda: st.tuples(
            st.just(path), value(path[-1], pool, len(path))))

    def apply(changes: list[tuple[tuple[FieldDescriptor, ...], Any]]) -> tuple[Message, str]:
        msg = type(base)()
        msg.CopyFrom(base)
        notes = []
        for path, v in changes:
            set_path(msg, path, v)
            notes.append(f"{'.'.join(f.name for f in path)} = {short(v)}")
        return msg, "; ".join(notes)

    return st.lists(st.sampled_from(paths).flatmap(one), min_size=1, max_size=3).map(apply)


def short(v: Any, limit: int = 200) -> str:
    text = repr(v) if not isinstance(v, Message) else "{" + str(v).replace("\n", " ") + "}"
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


# --- valid requests ---------------------------------------------------------------------

LONG_RUNNING = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
# RPCs that only get past their first check on a running container.
RUNNING_RPCS = {"Exec", "Attach", "ReopenContainerLog", "ContainerStats",
                "UpdateContainerResources"}
# No applet that runs another program, reads a device forever or writes files.
SAFE_APPLETS = {"sleep", "true", "false", "echo", "id"}


def pod_config(pool: Pool) -> pb.PodSandboxConfig:
    name = pool.next_name()
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="fuzz", uid=f"uid-{name}",
                                       attempt=0),
        hostname=name,
        log_directory=str(pool.allowed / "logs" / name),
        labels={"fuzz": "1"},
        annotations={"fuzz": name},
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(network=pb.POD, pid=pb.CONTAINER))),
        dns_config=pb.DNSConfig(servers=["10.0.0.10"], searches=["fuzz.local"]),
    )


def container_config(pool: Pool, command: list[str]) -> pb.ContainerConfig:
    name = pool.next_name()
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name),
        image=pb.ImageSpec(image=pool.image),
        command=command,
        envs=[pb.KeyValue(key="FUZZ", value=b"1")],
        working_dir="/",
        log_path=f"{name}.log",
        labels={"fuzz": "1"},
        mounts=[pb.Mount(container_path="/data/host", host_path=str(pool.allowed / "vol"),
                         readonly=True, mount_options=["nosuid", "nodev"])],
        linux=pb.LinuxContainerConfig(
            resources=pb.LinuxContainerResources(memory_limit_in_bytes=256 << 20,
                                                 cpu_shares=512),
            security_context=pb.LinuxContainerSecurityContext(
                run_as_user=pb.Int64Value(value=1000),
                namespace_options=pb.NamespaceOption(network=pb.POD, pid=pb.CONTAINER))),
    )


def valid(method: Method, pool: Pool) -> st.SearchStrategy[Message]:
    """A request that should succeed (or fail only because of the daemon's state)."""
    pods = pick(lambda: [p for p in pool.pods if p in pool.ready])
    ctrs = pick(lambda: pool.in_state(pb.CONTAINER_RUNNING))
    name = method.name
    if name == "RunPodSandbox":
        return st.builds(lambda: pb.RunPodSandboxRequest(config=pod_config(pool)))
    if name == "CreateContainer":
        def create(sid: str, cmd: list[str]) -> Message:
            return pb.CreateContainerRequest(
                pod_sandbox_id=sid, sandbox_config=pool.pods.get(sid, pod_config(pool)),
                config=container_config(pool, cmd))
        return st.builds(create, pods,
                         st.sampled_from([LONG_RUNNING, ["true"], ["sh", "-c", "exit 3"]]))
    if name == "ExecSync":
        return st.builds(lambda cid, cmd: pb.ExecSyncRequest(container_id=cid, cmd=cmd,
                                                             timeout=5),
                         ctrs, st.sampled_from([["echo", "hi"], ["id"], ["false"]]))
    if name == "PullImage":
        return st.builds(lambda ref: pb.PullImageRequest(image=pb.ImageSpec(image=ref)),
                         st.sampled_from([pool.image, f"{pool.registry}/fuzz/absent:1"]))
    if name == "UpdateContainerResources":
        return st.builds(lambda cid: pb.UpdateContainerResourcesRequest(
            container_id=cid, linux=pb.LinuxContainerResources(memory_limit_in_bytes=300 << 20,
                                                               cpu_shares=256)), ctrs)
    if name == "StopContainer":
        return st.builds(lambda cid: pb.StopContainerRequest(container_id=cid, timeout=2), ctrs)
    if name == "StartContainer":
        return st.builds(lambda cid: pb.StartContainerRequest(container_id=cid),
                         pick(lambda: pool.in_state(pb.CONTAINER_CREATED)))
    return with_ids(method, pool)


def with_ids(method: Method, pool: Pool) -> st.SearchStrategy[Message]:
    """The empty request with its top-level ID fields naming objects that exist."""
    wants_running = method.name in RUNNING_RPCS
    choices: dict[str, Callable[[], list[str]]] = {
        "pod_sandbox_id": lambda: list(pool.pods),
        "container_id": lambda: (pool.in_state(pb.CONTAINER_RUNNING) if wants_running
                                 else list(pool.containers)),
        "id": pool.ids,
    }
    fields: dict[str, st.SearchStrategy[Any]] = {
        f.name: pick(choices[f.name]) for f in method.request.DESCRIPTOR.fields
        if f.type == FieldDescriptor.TYPE_STRING and f.name in choices}
    image = method.request.DESCRIPTOR.fields_by_name.get("image")
    if image is not None and image.message_type is pb.ImageSpec.DESCRIPTOR:
        fields["image"] = pick(lambda: [pool.image, *pool.image_ids]).map(
            lambda r: pb.ImageSpec(image=r))
    return st.fixed_dictionaries(fields).map(lambda v: build(method.request, v))


def requests(pool: Pool) -> st.SearchStrategy[Request]:
    """Valid, almost valid (most of them) or random requests for any RPC."""
    return pool.cached("requests", lambda: _requests(pool))


def _requests(pool: Pool) -> st.SearchStrategy[Request]:
    names = sorted(METHODS)
    weighted = [n for n in names for _ in range(WEIGHTS.get(n, 1))]

    def for_method(name: str) -> st.SearchStrategy[Request]:
        m = METHODS[name]
        base = valid(m, pool)
        as_is = base.map(lambda msg: Request(m, msg, "valid"))
        almost = base.flatmap(lambda msg: mutated(msg, pool)).map(
            lambda mh: Request(m, mh[0], f"valid with {mh[1]}"))
        rand = message(m.request.DESCRIPTOR, pool).map(lambda msg: Request(m, msg, "random"))
        if len(m.request.DESCRIPTOR.fields) <= 2:  # mutating mostly hits the one ID
            return st.one_of(as_is, as_is, as_is, almost, rand)
        return st.one_of(as_is, as_is, almost, almost, rand)

    per_method = {n: for_method(n) for n in names}
    return st.sampled_from(weighted).flatmap(per_method.__getitem__)


# --- keeping requests away from the host ------------------------------------------------


def _inside(path: str, root: Path) -> bool:
    norm = posixpath.normpath(path)
    return path.startswith("/") and (norm == str(root) or norm.startswith(f"{root}/"))


def _pin(path: str, root: Path) -> str:
    """`path` if it stays under `root` (lexically; nothing under the canary is a symlink),
    else the same text moved under `root`, or plain `root/x` when even that escapes."""
    if _inside(path, root):
        return path
    moved = f"{root}/{path.lstrip('/')}"
    return moved if _inside(moved, root) else f"{root}/x"


def _relative_ok(path: str, depth: int) -> bool:
    """A relative path that climbs at most `depth` levels."""
    return not path.startswith("/") and not posixpath.normpath(
        posixpath.join(*[f"d{i}" for i in range(depth)], path)).startswith("..")


_SAFE_UNIFIED = {"memory.high", "memory.max", "memory.low", "pids.max", "cpu.weight",
                 "cpu.max", "io.weight", "memory.swap.max"}


def confine(msg: Message, pool: Pool, method: str) -> None:
    """Rewrite, in place, whatever could reach the host outside the canary or the loopback
    registry. Log directories sit 3 levels under the canary (allowed/logs/<pod>), so a
    log path may climb 3 levels and still land inside it, in `protected/` at worst."""
    if isinstance(msg, pb.CreateContainerRequest):
        _confine_container_ns(msg, pool)
    for sub, f, v in list(walk(msg)):
        name = f.name
        if f.type == FieldDescriptor.TYPE_STRING and not f.is_repeated and not is_map(f):
            setattr(sub, name, _confine_string(sub, name, v, pool))
        elif is_map(f) and name == "unified":
            for key in [k for k in v if k not in _SAFE_UNIFIED and "\x00" not in k]:
                del v[key]
        elif is_map(f) and name == "sysctls":
            _confine_sysctls(sub, v)
        elif name in ("command", "args", "cmd") and f.is_repeated:
            _confine_argv(sub, method)
        elif name == "timeout" and method in ("StopContainer", "ExecSync") and v > 5:
            setattr(sub, name, 5)
        elif name == "host_port" and 0 < v <= 65535:
            setattr(sub, name, 30000 + v % 1000)


def walk(msg: Message) -> Iterator[tuple[Message, FieldDescriptor, Any]]:
    """(message, field, value) for every set field, depth first."""
    for f, v in msg.ListFields():
        yield msg, f, v
        if f.message_type is None or is_map(f):
            if is_map(f) and f.message_type.fields_by_name["value"].message_type is not None:
                for item in v.values():
                    yield from walk(item)
            continue
        for item in v if f.is_repeated else [v]:
            yield from walk(item)


def _confine_string(sub: Message, name: str, v: str, pool: Pool) -> str:
    kind = sub.DESCRIPTOR.name
    if name in ("host_path", "log_directory", "location", "output_path", "checkpoint_path",
                "localhost_ref"):
        root = pool.allowed / "logs" if name == "log_directory" else pool.allowed
        v = _pin(v, root)
        if name == "log_directory" and posixpath.normpath(v).count("/") < str(
                root).count("/") + 1:
            v = f"{root}/x"
        return v
    if name == "log_path":
        if v.startswith("/"):
            return _pin(v, pool.canary)
        return v if _relative_ok(v, 3) else "x.log"
    if name == "seccomp_profile_path" and v.startswith("localhost/"):
        return "localhost/" + _pin(v.removeprefix("localhost/"), pool.allowed)
    if name == "seccomp_profile_path" and v.startswith("/"):
        return _pin(v, pool.allowed)
    if (name in ("image", "user_specified_image") and kind == "ImageSpec"
            and not v.startswith(f"{pool.registry}/") and v not in pool.image_ids):
        return f"{pool.registry}/{v}"
    return v


def _confine_sysctls(sub: Message, sysctls: Any) -> None:
    """No namespaced sysctl where the namespace is the host's."""
    ns = getattr(getattr(sub, "security_context", None), "namespace_options", None)
    for key in list(sysctls):
        host_net = ns is None or ns.network == pb.NODE
        host_ipc = ns is None or ns.ipc == pb.NODE
        if (key.startswith("net.") and host_net) or (not key.startswith("net.") and host_ipc):
            del sysctls[key]


def _confine_container_ns(req: pb.CreateContainerRequest, pool: Pool) -> None:
    """The pod's sysctls go into each container's spec: keep its net and IPC namespaces
    the pod's own when the pod has any (or is unknown)."""
    pod = pool.pods.get(req.pod_sandbox_id)
    if pod is not None and not pod.linux.sysctls and not req.sandbox_config.linux.sysctls:
        return
    ns = req.config.linux.security_context.namespace_options
    if ns.network == pb.NODE:
        ns.network = pb.POD
    if ns.ipc == pb.NODE:
        ns.ipc = pb.POD


def _confine_argv(sub: Message, method: str) -> None:
    """Only harmless applets run: the fixed long-running script, or one of SAFE_APPLETS
    (any arguments); in exec, sleep is cut to 1 s so no call waits on it."""
    argv = [*getattr(sub, "command", []), *getattr(sub, "args", [])] or list(
        getattr(sub, "cmd", []))
    if not argv or argv == LONG_RUNNING:
        return
    exe = posixpath.basename(argv[0])
    if exe in SAFE_APPLETS and not (exe == "sleep" and method in ("ExecSync", "Exec")):
        return
    looks_like_program = re.fullmatch(r"[\w./+-]+", argv[0]) is not None
    if not looks_like_program:
        return  # NUL, spaces, control characters: no such file, the runtime refuses it
    for name in ("command", "args", "cmd"):
        if name in sub.DESCRIPTOR.fields_by_name:
            del getattr(sub, name)[:]
    first = "cmd" if "cmd" in sub.DESCRIPTOR.fields_by_name else "command"
    getattr(sub, first).extend(["sleep", "1"])


# --- running it -------------------------------------------------------------------------


@dataclass
class Finding:
    key: str
    rpc: str
    code: str
    message: str
    how: str
    request: str
    trace: str = ""
    count: int = 1
    minimal: str = ""


def finding_key(rpc: str, code: str, message: str) -> str:
    """Same RPC, code and message shape (IDs, numbers and quoted values blanked)."""
    shape = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message[:300])
    shape = re.sub(r"[0-9a-f]{12,}|\d+", "N", shape)
    return f"{rpc} {code} {shape[:160]}"


class Fuzzer:
    """Sends requests to a live daemon and keeps counts, findings and the object pool."""

    def __init__(self, proc: PycriProcess, pool: Pool, ipam: Path, network: str = "") -> None:
        self.proc = proc
        self.network = network
        self.pool = pool
        self.ipam = ipam
        self.channel = grpc.insecure_channel(
            f"unix://{proc.socket}",
            options=[("grpc.max_receive_message_length", 64 << 20),
                     ("grpc.max_send_message_length", 64 << 20)])
        self.problems: list[str] = []
        self.counts: Counter[tuple[str, str]] = Counter()
        self.findings: dict[str, Finding] = {}
        self.ever: set[str] = set()
        self.log_offset = 0
        self.sent = 0
        self.restarts = 0
        self.elapsed = 0.0
        self.harness_errors: Counter[str] = Counter()

    # -- one call

    def invoke(self, name: str, msg: Message, timeout: float | None = None) -> tuple[
            grpc.StatusCode, str, Message | None]:
        m = METHODS[name]
        deadline = timeout or (60.0 if name in SLOW else 10.0)
        try:
            if m.streaming:
                call = self.channel.unary_stream(m.path, m.request.SerializeToString,
                                                 m.response.FromString)
                it = call(msg, timeout=1.0)
                with contextlib.suppress(StopIteration):
                    next(it)
                return grpc.StatusCode.OK, "", None
            fn = self.channel.unary_unary(m.path, m.request.SerializeToString,
                                          m.response.FromString)
            return grpc.StatusCode.OK, "", fn(msg, timeout=deadline)
        except grpc.RpcError as e:
            code, details = e.code(), e.details() or ""
            if m.streaming and code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return grpc.StatusCode.OK, "", None
            return code, details, None

    def call(self, req: Request) -> grpc.StatusCode:
        """Send one (confined) request, judge the answer, update the pool."""
        confine(req.msg, self.pool, req.method.name)
        name = req.method.name
        self.sent += 1
        code, details, resp = self.invoke(name, req.msg)
        self.counts[(name, code.name)] += 1
        if code in BAD_CODES or code == grpc.StatusCode.DEADLINE_EXCEEDED:
            self.record(req, code, details)
        elif code == grpc.StatusCode.UNAVAILABLE and self.proc.proc is not None and (
                self.proc.proc.poll() is not None):
            self.record(req, code, f"daemon died (exit {self.proc.proc.returncode})")
            self.restart()
        if resp is not None:
            self.learn(name, req.msg, resp)
        return code

    def learn(self, name: str, msg: Any, resp: Any) -> None:
        if name == "RunPodSandbox":
            self.pool.pods[resp.pod_sandbox_id] = msg.config
            self.pool.ready.add(resp.pod_sandbox_id)
            self.ever.add(resp.pod_sandbox_id)
        elif name == "StopPodSandbox":
            self.pool.ready.discard(msg.pod_sandbox_id)
        elif name == "CreateContainer":
            self.pool.containers[resp.container_id] = msg.pod_sandbox_id
            self.pool.states[resp.container_id] = pb.CONTAINER_CREATED
            self.ever.add(resp.container_id)
        elif name == "StartContainer":
            self.pool.states[msg.container_id] = pb.CONTAINER_RUNNING
        elif name == "StopContainer":
            self.pool.states[msg.container_id] = pb.CONTAINER_EXITED
        elif name == "RemoveImage":
            self.keep_image()
        elif name == "PullImage" and resp.image_ref not in self.pool.image_ids:
            self.pool.image_ids.append(resp.image_ref)

    def record(self, req: Request, code: grpc.StatusCode, details: str) -> None:
        key = finding_key(req.method.name, code.name, details)
        if key in self.findings:
            self.findings[key].count += 1
            return
        text = short(req.msg, 2000)
        f = Finding(key=key, rpc=req.method.name, code=code.name, message=details[:500],
                    how=short(req.how, 600), request=text, trace=self.trace(req.method.name))
        self.findings[key] = f
        if req.how == "random" and code in BAD_CODES:
            f.minimal = self.minimize(req, key)

    def trace(self, rpc: str) -> str:
        """The daemon's last traceback for `rpc` since the previous look."""
        with contextlib.suppress(OSError), open(self.proc.log, "rb") as log:
            log.seek(self.log_offset)
            text = log.read().decode(errors="replace")
            self.log_offset += len(text.encode())
            start = text.rfind(f"{rpc}: unexpected error")
            if start >= 0:
                lines = text[start:].splitlines()
                end = next((i for i, line in enumerate(lines[1:], 1)
                            if not line.startswith((" ", "Traceback", "During", "The above"))
                            and line.strip()), len(lines))
                return "\n".join(lines[: end + 1])[-3000:]
        return ""

    def minimize(self, req: Request, key: str, budget: int = 40) -> str:
        """Clear set fields one at a time while the same finding still comes back."""
        msg = type(req.msg)()
        msg.CopyFrom(req.msg)
        changed = True
        while changed and budget > 0:
            changed = False
            for sub, f, _ in list(walk(msg)):
                if budget <= 0:
                    break
                trial = type(msg)()
                trial.CopyFrom(msg)
                target = _locate(trial, msg, sub)
                if target is None:
                    continue
                target.ClearField(f.name)
                budget -= 1
                code, details, resp = self.invoke(req.method.name, trial)
                if resp is not None:
                    self.learn(req.method.name, trial, resp)
                if finding_key(req.method.name, code.name, details) == key:
                    msg = trial
                    changed = True
                    break
        return short(msg, 2000)

    # -- between batches

    def check_alive(self) -> str | None:
        """None if the daemon answered Version within 1 s, else what went wrong
        (and the daemon is restarted so the run can go on)."""
        code, details, _ = self.invoke("Version", pb.VersionRequest(), timeout=1.0)
        if code == grpc.StatusCode.OK:
            return None
        alive = "up" if self.proc.proc is None or self.proc.proc.poll() is None else "dead"
        problem = f"Version after a batch: {code.name} {details} (daemon {alive})"
        self.restart()
        return problem

    def restart(self) -> None:
        """Kill and restart the daemon if this process owns it (else only reconnect)."""
        self.channel.close()
        if self.proc.proc is not None:
            self.restarts += 1
            self.proc.kill()
            self.proc.start()
        self.channel = grpc.insecure_channel(
            f"unix://{self.proc.socket}",
            options=[("grpc.max_receive_message_length", 64 << 20),
                     ("grpc.max_send_message_length", 64 << 20)])

    def refresh(self, keep_pods: int = 6, shared: bool = False, max_age: int = 300) -> None:
        """Re-read what exists; remove pods the pool does not know (unless other workers
        share the daemon), pods older than `max_age` s, and the oldest beyond `keep_pods`,
        so a long run holds a bounded number of netns and processes."""
        _, _, pods = self.invoke("ListPodSandbox", pb.ListPodSandboxRequest())
        _, _, ctrs = self.invoke("ListContainers", pb.ListContainersRequest())
        if pods is None or ctrs is None:
            return
        live = [p.id for p in pods.items]  # type: ignore[attr-defined]
        old = time.time_ns() - max_age * 10**9
        for p in pods.items:  # type: ignore[attr-defined]
            self.ever.add(p.id)
            if (p.id not in self.pool.pods and not shared) or p.created_at < old:
                self.remove_pod(p.id)
        self.pool.pods = {k: v for k, v in self.pool.pods.items() if k in live}
        self.pool.ready = {p.id for p in pods.items  # type: ignore[attr-defined]
                           if p.state == pb.SANDBOX_READY}
        mine = [c for c in ctrs.containers  # type: ignore[attr-defined]
                if c.pod_sandbox_id in self.pool.pods]
        self.pool.containers = {c.id: c.pod_sandbox_id for c in mine}
        self.pool.states = {c.id: c.state for c in mine}
        for sid in list(self.pool.pods)[:-keep_pods]:
            self.remove_pod(sid)
        self.keep_image()

    def keep_image(self) -> None:
        """Pull the test image again if a fuzzed RemoveImage took it away."""
        status = pb.ImageStatusRequest(image=pb.ImageSpec(image=self.pool.image))
        found = self.invoke("ImageStatus", status)[2]
        if found is not None and not found.HasField("image"):  # type: ignore[attr-defined]
            self.invoke("PullImage", pb.PullImageRequest(image=status.image))

    def remove_pod(self, sid: str) -> None:
        for name, msg in (("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sid)),
                          ("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sid))):
            code, details, _ = self.invoke(name, msg)
            if code != grpc.StatusCode.OK and code != grpc.StatusCode.NOT_FOUND:
                self.record(Request(METHODS[name], msg, "cleanup"), code, details)
        self.pool.pods.pop(sid, None)
        self.pool.containers = {c: p for c, p in self.pool.containers.items() if p != sid}

    def remove_all(self) -> None:
        _, _, pods = self.invoke("ListPodSandbox", pb.ListPodSandboxRequest())
        for p in getattr(pods, "items", []):
            self.ever.add(p.id)
            self.remove_pod(p.id)
        _, _, ctrs = self.invoke("ListContainers", pb.ListContainersRequest())
        for c in getattr(ctrs, "containers", []):
            self.invoke("RemoveContainer", pb.RemoveContainerRequest(container_id=c.id))

    # -- at the end

    def leaks(self, tmp: Path) -> dict[str, list[str]]:
        """What is left after remove_all(): host objects, leases, DB rows, canary changes.
        Stops the daemon."""
        from tests.e2e.conftest import leftovers

        out = leftovers(tmp, self.ever | {p.name for p in (tmp / "root" / "sandboxes").glob("*")})
        out["leases"] = sorted(p.name for p in self.ipam.glob("*/*")
                               if p.name not in ("lock",) and not p.name.startswith("last_"))
        # pycri holds its database exclusively: the rows are read once it has stopped.
        self.proc.stop(signal.SIGTERM)
        out["rows"] = db_rows(self.proc.root / "pycri.db")
        nat = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True)
        out["nat"] = [r for r in nat.stdout.splitlines() if self.network in r]
        out["canary"] = canary_changes(self.pool)
        return out

    def report(self) -> str:
        lines = ["requests per RPC and status:"]
        per_rpc: dict[str, Counter[str]] = {}
        for (rpc, code), n in self.counts.items():
            per_rpc.setdefault(rpc, Counter())[code] = n
        for rpc in sorted(per_rpc):
            codes = ", ".join(f"{c} {n}" for c, n in per_rpc[rpc].most_common())
            lines.append(f"  {rpc:28} {sum(per_rpc[rpc].values()):6}  {codes}")
        totals = Counter[str]()
        for (_, code), n in self.counts.items():
            totals[code] += n
        lines.append("per status: " + ", ".join(f"{c} {n}" for c, n in totals.most_common()))
        lines.append(f"sent {self.sent}, daemon restarts {self.restarts}, "
                     f"findings {len(self.findings)}")
        lines += [f"harness error x{n}: {e}" for e, n in self.harness_errors.items()]
        for f in self.findings.values():
            lines += [f"--- finding x{f.count}: {f.key}", f"  message: {f.message}",
                      f"  how: {f.how}", f"  request: {f.request}"]
            if f.minimal:
                lines.append(f"  minimal: {f.minimal}")
            if f.trace:
                lines.append("  trace:\n    " + f.trace.replace("\n", "\n    "))
        return "\n".join(lines)


def _locate(trial: Message, orig: Message, sub: Message) -> Message | None:
    """The message in `trial` at the position `sub` has in `orig`."""
    if sub is orig:
        return trial
    for (f, v), (_, tv) in zip(orig.ListFields(), trial.ListFields(), strict=True):
        if f.message_type is None:
            continue
        if is_map(f):
            items = list(zip(v.values(), tv.values(), strict=True)) if (
                f.message_type.fields_by_name["value"].message_type is not None) else []
        elif f.is_repeated:
            items = list(zip(v, tv, strict=True))
        else:
            items = [(v, tv)]
        for o, t in items:
            found = _locate(t, o, sub)
            if found is not None:
                return found
    return None


def db_rows(db: Path) -> list[str]:
    """Sandbox and container records still in the daemon's database."""
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT kind, id FROM records WHERE kind IN "
                           "('sandbox', 'container', 'snapshot')").fetchall()
    finally:
        con.close()
    return [f"{k}/{i}" for k, i in rows]


# --- the canary ---------------------------------------------------------------------------


def make_canary(canary: Path) -> None:
    """`allowed/` is where requests may point; `protected/` holds files nothing may change
    (log paths that climb out of their pod's directory land there)."""
    (canary / "allowed" / "vol").mkdir(parents=True)
    (canary / "allowed" / "logs").mkdir()
    (canary / "allowed" / "vol" / "file").write_text("volume\n")
    (canary / "allowed" / "profile.json").write_text(
        json.dumps({"defaultAction": "SCMP_ACT_ALLOW"}))
    os.mkfifo(canary / "allowed" / "fifo")
    os.mknod(canary / "allowed" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    prot = canary / "protected"
    prot.mkdir()
    (prot / "secret").write_text("do not touch\n")
    (prot / "x.log").write_text("an existing log a hostile log_path may point at\n")
    (canary / "x").write_text("the file paths are moved to when they escape\n")
    (canary / ".snapshot").write_text(json.dumps(_snapshot(canary)))


def _entry(p: Path) -> str:
    """A file's content hash, or its type (and device number), never opening anything
    that is not a regular file."""
    st_ = os.lstat(p)
    if stat.S_ISREG(st_.st_mode):
        return hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    return f"{stat.S_IFMT(st_.st_mode):o}:{st_.st_rdev}"


def _snapshot(canary: Path) -> dict[str, str]:
    return {str(p.relative_to(canary)): _entry(p) for p in sorted(canary.rglob("*"))
            if p.name != ".snapshot" and not p.is_relative_to(canary / "allowed" / "logs")}


def canary_changes(pool: Pool) -> list[str]:
    """Changes under the canary: anything in `protected/` or its top level, and any file
    that was there at the start. New entries under `allowed/` are fine (host paths that
    did not exist may be created)."""
    before = json.loads((pool.canary / ".snapshot").read_text())
    now = _snapshot(pool.canary)
    keys = before.keys() | {k for k in now if not k.startswith("allowed/")}
    return sorted(f"{k}: {before.get(k)} -> {now.get(k)}" for k in keys
                  if before.get(k) != now.get(k))


# --- a private node ---------------------------------------------------------------------


@dataclass
class FuzzNode:
    proc: PycriProcess
    pool: Pool
    ipam: Path
    bridge: str


def start_node(tmp: Path, image: str, registry: str, bridge: str, subnet: str) -> FuzzNode:
    """A daemon with its own root/state/socket and CNI network, the image pulled."""
    from tests.e2e.conftest import conflist

    net_d = tmp / "net.d"
    net_d.mkdir(parents=True)
    ipam = tmp / "ipam"
    (net_d / "10-fuzz.conflist").write_text(conflist(bridge, subnet, ipam, []))
    config = tmp / "pycri.toml"
    config.write_text(
        f'[cni]\nconf_dir = "{net_d}"\ndefault_network = false\n'
        f'[images]\nregistries_conf = "{tmp / "registries.conf"}"\n'
        f'registries_conf_dir = "{tmp / "registries.conf.d"}"\n'
        f'[nri]\nsocket_path = "{tmp / "nri.sock"}"\nplugin_path = "{tmp / "nri-plugins"}"\n'
        f'{NO_DEFAULT_CADVISOR}')
    proc = PycriProcess(root=tmp / "root", state=tmp / "state", socket=tmp / "state" / "p.sock",
                        config=config, log=tmp / "pycri.log")
    proc.start()
    canary = tmp / "canary"
    make_canary(canary)
    pool = Pool(image=image, registry=registry, canary=canary)
    with grpc.insecure_channel(f"unix://{proc.socket}") as ch:
        from pycri.api.api_pb2_grpc import ImageServiceStub

        ref = ImageServiceStub(ch).PullImage(
            pb.PullImageRequest(image=pb.ImageSpec(image=image)), timeout=120).image_ref
    pool.image_ids.append(ref)
    return FuzzNode(proc=proc, pool=pool, ipam=ipam, bridge=bridge)


def stop_node(node: FuzzNode, tmp: Path) -> int:
    """Stop the daemon by pid; scrub whatever it left (after the leak check)."""
    from tests.e2e.conftest import _scrub

    status = node.proc.stop(signal.SIGTERM)
    _scrub(tmp)
    subprocess.run(["ip", "link", "del", node.bridge], capture_output=True)
    return status


def run(fuzzer: Fuzzer, total: int, batch: int, seed: int | None,
        progress: Callable[[Fuzzer], None] | None = None, shared: bool = False) -> list[str]:
    """Send `total` generated requests in batches; after each batch check the daemon
    and trim the pool. Returns the liveness problems seen."""
    import warnings

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis.errors import HypothesisWarning

    warnings.filterwarnings("ignore", category=HypothesisWarning)  # repr of huge strategies

    problems: list[str] = []
    started = time.monotonic()
    while fuzzer.sent < total:
        n = min(batch, total - fuzzer.sent)

        @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), derandomize=False)
        @given(st.data())
        def one_batch(data: st.DataObject) -> None:
            req = data.draw(requests(fuzzer.pool))
            try:
                fuzzer.call(req)
            except Exception as e:  # a harness bug must not end a long run unseen
                fuzzer.harness_errors[f"{req.method.name}: {type(e).__name__}: {e}"[:300]] += 1

        if seed is not None:
            one_batch = hseed(seed + fuzzer.sent)(one_batch)
        before = fuzzer.sent
        try:
            one_batch()
        except Exception as e:  # hypothesis gave up on this batch; the next one goes on
            fuzzer.harness_errors[f"batch: {type(e).__name__}: {e}"[:300]] += 1
        if fuzzer.sent == before:
            break  # hypothesis found nothing new to generate
        if (problem := fuzzer.check_alive()) is not None:
            problems.append(f"after {fuzzer.sent} requests: {problem}")
        fuzzer.refresh(shared=shared)
        if progress is not None:
            progress(fuzzer)
    fuzzer.elapsed = time.monotonic() - started
    return problems


@dataclass
class Job:
    """What a worker process needs to fuzz a daemon it does not own."""

    proc: PycriProcess
    pool: Pool
    ipam: Path
    total: int
    batch: int
    seed: int | None


def _worker(job: Job) -> dict[str, Any]:
    fz = Fuzzer(job.proc, job.pool, job.ipam)
    started = time.monotonic()

    def progress(f: Fuzzer) -> None:
        if f.sent % (job.batch * 10) < job.batch:
            rate = f.sent / max(time.monotonic() - started, 1e-3)
            print(f"{time.strftime('%H:%M:%S')} {job.pool.prefix} sent {f.sent} "
                  f"({rate:.1f}/s), findings {len(f.findings)}", flush=True)

    try:
        problems = run(fz, job.total, job.batch, job.seed, progress, shared=True)
    except Exception as e:  # keep what this worker found so far
        problems = []
        fz.harness_errors[f"worker: {type(e).__name__}: {e}"[:300]] += 1
    fz.channel.close()
    return {"counts": dict(fz.counts), "findings": fz.findings, "ever": fz.ever,
            "problems": problems, "harness": dict(fz.harness_errors), "sent": fz.sent}


def run_parallel(fuzzer: Fuzzer, workers: int, total: int, batch: int,
                 seed: int | None) -> list[str]:
    """`workers` processes fuzz the daemon `fuzzer` owns, at once; meanwhile this process
    asks Version every 2 s (1 s deadline) and restarts a daemon that died or stopped
    answering. Results are merged into `fuzzer`."""
    import dataclasses
    import multiprocessing

    started = time.monotonic()
    worker_proc = dataclasses.replace(fuzzer.proc, proc=None)
    jobs = [Job(worker_proc, dataclasses.replace(fuzzer.pool, prefix=f"w{i}-", strategies={},
                                                 pods={}, containers={}),
                fuzzer.ipam, total // workers + (i < total % workers), batch,
                None if seed is None else seed + i * 7919) for i in range(workers)]
    problems: list[str] = []
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that has gRPC threads
    with ctx.Pool(workers) as mp:
        pending = [mp.apply_async(_worker, (job,)) for job in jobs]
        misses = 0
        while not all(r.ready() for r in pending):
            time.sleep(2)
            code, details, _ = fuzzer.invoke("Version", pb.VersionRequest(), timeout=1.0)
            dead = fuzzer.proc.proc is not None and fuzzer.proc.proc.poll() is not None
            misses = 0 if code == grpc.StatusCode.OK else misses + 1
            if dead or misses >= 3:
                problems.append(f"{time.strftime('%H:%M:%S')} daemon "
                                f"{'died' if dead else 'unresponsive'}: {code.name} {details}")
                fuzzer.restart()
                misses = 0
        for r in pending:
            try:
                res = r.get()
            except Exception as e:  # a worker's failure is reported, not the run's end
                fuzzer.harness_errors[f"worker: {type(e).__name__}: {e}"[:300]] += 1
                continue
            fuzzer.counts.update(res["counts"])
            fuzzer.sent += res["sent"]
            fuzzer.ever |= res["ever"]
            fuzzer.harness_errors.update(res["harness"])
            problems += res["problems"]
            for key, f in res["findings"].items():
                if key in fuzzer.findings:
                    fuzzer.findings[key].count += f.count
                else:
                    fuzzer.findings[key] = f
    fuzzer.elapsed = time.monotonic() - started
    return problems
