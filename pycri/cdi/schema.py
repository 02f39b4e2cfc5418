"""A CDI spec document (already decoded from JSON or YAML) checked into dataclasses.

Strict like the spec asks: an unknown field, a wrong type, or a field newer than the
file's `cdiVersion` is an error (e.g. `hostPath` on a device node needs 0.5.0,
`additionalGids` 0.7.0). Versions read: 0.3.0 to 1.0.x; 1.1.0's network devices and
RDT schemata are not supported, so a 1.1 file is refused rather than half-applied.
Errors are `SpecError` with a message naming the field's path in the document and
the rule it breaks, never its value: a spec dir entry may be a link to any file root
can read (/etc/shadow parses as YAML whose keys are its lines, issue 22 defect 7), and
the message reaches the CRI client. Only a version number is repeated.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pycri.cdi import names

# (major, minor) -> what that version added; the patch level adds no fields.
VERSIONS = ((0, 3), (0, 4), (0, 5), (0, 6), (0, 7), (0, 8), (1, 0))
V_MOUNT_TYPE, V_HOST_PATH, V_ANNOTATIONS, V_GIDS = (0, 4), (0, 5), (0, 6), (0, 7)
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer",
              "poststart", "poststop")
DEVICE_TYPES = ("b", "c", "u", "p")
MAX_ITEMS = 4096  # entries in any one list of a spec (devices, env, mounts, ...)
_VERSION_RE = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")
_U32 = 2**32 - 1

T = TypeVar("T")


class SpecError(ValueError):
    """A CDI spec document that does not follow the CDI spec."""


@dataclass(frozen=True)
class DeviceNode:
    path: str
    host_path: str = ""
    type: str = ""
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str = ""
    uid: int | None = None
    gid: int | None = None


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    type: str = ""
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Hook:
    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


@dataclass(frozen=True)
class IntelRdt:
    clos_id: str = ""
    l3_cache_schema: str = ""
    mem_bw_schema: str = ""


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    additional_gids: tuple[int, ...] = ()
    intel_rdt: IntelRdt | None = None

    def empty(self) -> bool:
        return self == ContainerEdits()


@dataclass(frozen=True)
class Device:
    name: str
    edits: ContainerEdits = field(default_factory=ContainerEdits)


@dataclass(frozen=True)
class Spec:
    version: str
    kind: str
    devices: tuple[Device, ...]
    edits: ContainerEdits = field(default_factory=ContainerEdits)


def parse_version(text: Any) -> tuple[int, int]:
    """(major, minor) of a supported `cdiVersion`, else SpecError."""
    m = _VERSION_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise SpecError("cdiVersion: expected a version like 0.6.0")
    v = (int(m[1]), int(m[2]))
    if v not in VERSIONS:
        raise SpecError(f"cdiVersion: {text} is not supported (pycri reads 0.3.0 to 1.0.x)")
    return v


class _Reader:
    """Typed access to one document, remembering its version for the `since` checks."""

    def __init__(self, version: tuple[int, int]) -> None:
        self.version = version

    def since(self, v: tuple[int, int], where: str) -> None:
        if self.version < v:
            raise SpecError(f"{where}: needs cdiVersion {v[0]}.{v[1]}.0 or later")

    @staticmethod
    def obj(value: Any, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise SpecError(f"{where}: expected an object, got {type(value).__name__}")
        for i, k in enumerate(value):
            if k not in allowed:
                raise SpecError(f"{where}: unknown field (its field {i + 1}; known: "
                                f"{', '.join(allowed)})")
        return value

    @staticmethod
    def string(value: Any, where: str, *, required: bool = False) -> str:
        if not isinstance(value, str) or "\0" in value:
            raise SpecError(f"{where}: expected a string")
        if required and not value:
            raise SpecError(f"{where}: must not be empty")
        return value

    @staticmethod
    def integer(value: Any, where: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise SpecError(f"{where}: expected an integer in {lo}..{hi}")
        return value

    @staticmethod
    def items(value: Any, where: str, each: Callable[[Any, str], T]) -> tuple[T, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise SpecError(f"{where}: expected an array, got {type(value).__name__}")
        if len(value) > MAX_ITEMS:
            raise SpecError(f"{where}: more than {MAX_ITEMS} entries")
        return tuple(each(v, f"{where}[{i}]") for i, v in enumerate(value))

    def annotations(self, value: Any, where: str) -> None:
        """Annotations carry nothing pycri applies; only their shape and version count."""
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise SpecError(f"{where}: expected an object of strings")
        if value:
            self.since(V_ANNOTATIONS, where)

    def env(self, value: Any, where: str) -> str:
        s = self.string(value, where)
        if not s.partition("=")[0] or "=" not in s:
            raise SpecError(f"{where}: expected NAME=value")
        return s

    def absolute(self, value: Any, where: str) -> str:
        s = self.string(value, where, required=True)
        if not os.path.isabs(s):
            raise SpecError(f"{where}: expected an absolute path")
        return s

    def device_node(self, value: Any, where: str) -> DeviceNode:
        d = self.obj(value, where, ("path", "hostPath", "type", "major", "minor", "fileMode",
                                    "permissions", "uid", "gid"))
        host = ""
        if "hostPath" in d:
            self.since(V_HOST_PATH, f"{where}.hostPath")
            host = self.absolute(d["hostPath"], f"{where}.hostPath")
        kind = self.string(d.get("type", ""), f"{where}.type")
        if kind and kind not in DEVICE_TYPES:
            raise SpecError(f"{where}.type: expected one of {', '.join(DEVICE_TYPES)}")
        perms = self.string(d.get("permissions", ""), f"{where}.permissions")
        if set(perms) - set("rwm"):
            raise SpecError(f"{where}.permissions: expected letters of 'rwm'")

        def opt(key: str, hi: int, lo: int = 0) -> int | None:
            return None if key not in d else self.integer(d[key], f"{where}.{key}", lo, hi)

        return DeviceNode(
            path=self.absolute(d.get("path"), f"{where}.path"),
            host_path=host,
            type=kind,
            major=opt("major", 2**63 - 1, -(2**63)),
            minor=opt("minor", 2**63 - 1, -(2**63)),
            file_mode=opt("fileMode", 0o7777),
            permissions=perms,
            uid=opt("uid", _U32),
            gid=opt("gid", _U32),
        )

    def mount(self, value: Any, where: str) -> Mount:
        m = self.obj(value, where, ("hostPath", "containerPath", "type", "options"))
        if "type" in m:
            self.since(V_MOUNT_TYPE, f"{where}.type")
        return Mount(
            host_path=self.string(m.get("hostPath"), f"{where}.hostPath", required=True),
            container_path=self.absolute(m.get("containerPath"), f"{where}.containerPath"),
            type=self.string(m.get("type", ""), f"{where}.type"),
            options=self.items(m.get("options"), f"{where}.options", self.string),
        )

    def hook(self, value: Any, where: str) -> Hook:
        h = self.obj(value, where, ("hookName", "path", "args", "env", "timeout"))
        name = self.string(h.get("hookName"), f"{where}.hookName", required=True)
        if name not in HOOK_NAMES:
            raise SpecError(f"{where}.hookName: expected one of {', '.join(HOOK_NAMES)}")
        return Hook(
            hook_name=name,
            path=self.absolute(h.get("path"), f"{where}.path"),
            args=self.items(h.get("args"), f"{where}.args", self.string),
            env=self.items(h.get("env"), f"{where}.env", self.env),
            timeout=None if "timeout" not in h
            else self.integer(h["timeout"], f"{where}.timeout", 1, 2**31 - 1),
        )

    def intel_rdt(self, value: Any, where: str) -> IntelRdt:
        self.since(V_GIDS, where)
        r = self.obj(value, where, ("closID", "l3CacheSchema", "memBwSchema"))
        return IntelRdt(
            clos_id=self.string(r.get("closID", ""), f"{where}.closID"),
            l3_cache_schema=self.string(r.get("l3CacheSchema", ""), f"{where}.l3CacheSchema"),
            mem_bw_schema=self.string(r.get("memBwSchema", ""), f"{where}.memBwSchema"),
        )

    def edits(self, value: Any, where: str) -> ContainerEdits:
        e = self.obj(value, where, ("env", "deviceNodes", "mounts", "hooks", "additionalGids",
                                    "intelRdt"))
        gids = self.items(e.get("additionalGids"), f"{where}.additionalGids",
                          lambda v, w: self.integer(v, w, 0, _U32))
        if gids:
            self.since(V_GIDS, f"{where}.additionalGids")
        return ContainerEdits(
            env=self.items(e.get("env"), f"{where}.env", self.env),
            device_nodes=self.items(e.get("deviceNodes"), f"{where}.deviceNodes",
                                    self.device_node),
            mounts=self.items(e.get("mounts"), f"{where}.mounts", self.mount),
            hooks=self.items(e.get("hooks"), f"{where}.hooks", self.hook),
            additional_gids=gids,
            intel_rdt=None if e.get("intelRdt") is None
            else self.intel_rdt(e["intelRdt"], f"{where}.intelRdt"),
        )

    def device(self, value: Any, where: str) -> Device:
        d = self.obj(value, where, ("name", "annotations", "containerEdits"))
        name = self.string(d.get("name"), f"{where}.name", required=True)
        if names.device_name_problem(name):
            raise SpecError(f"{where}.name: {names.DEVICE_RULE}")
        if name[0].isdigit():
            self.since(V_HOST_PATH, f"{where}.name (starting with a digit)")
        self.annotations(d.get("annotations", {}), f"{where}.annotations")
        edits = d.get("containerEdits")
        return Device(name=name, edits=ContainerEdits() if edits is None
                      else self.edits(edits, f"{where}.containerEdits"))


def parse_spec(doc: Any) -> Spec:
    """The checked spec of one decoded document."""
    top = _Reader.obj(doc, "spec", ("cdiVersion", "kind", "annotations", "devices",
                                    "containerEdits"))
    r = _Reader(parse_version(top.get("cdiVersion")))
    kind = r.string(top.get("kind"), "kind", required=True)
    if names.kind_problem(kind):
        raise SpecError(f"kind: {names.KIND_RULE}")
    if "." in kind.partition("/")[2]:
        r.since(V_ANNOTATIONS, "kind (a '.' in the class)")
    r.annotations(top.get("annotations", {}), "annotations")
    devices = r.items(top.get("devices"), "devices", r.device)
    if not devices:
        raise SpecError("devices: a spec must define at least one device")
    seen: dict[str, int] = {}
    for i, d in enumerate(devices):
        if d.name in seen:
            raise SpecError(f"devices[{i}].name: defined before, by devices[{seen[d.name]}]")
        seen[d.name] = i
    edits = top.get("containerEdits")
    return Spec(version=top["cdiVersion"], kind=kind, devices=devices,
                edits=ContainerEdits() if edits is None else r.edits(edits, "containerEdits"))
