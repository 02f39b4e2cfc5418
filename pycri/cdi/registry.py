"""The CDI spec files of the node: found in the spec dirs, checked, cached, resolved.

Each resolve (from a worker thread: it stats and reads files) lists the spec dirs
and stats their `*.json`/`*.yaml` entries; a file is parsed again only when its
inode, size or mtime changed, so an edited spec takes effect on the next
CreateContainer without a re-parse on every call. Later dirs override earlier ones
(the CDI spec's priority: /var/run/cdi over /etc/cdi); the same device in two files
of one dir is a conflict. A file that cannot be read or checked is reported when a
device of its kind (or an unknown device) is asked for, naming the file and what is
wrong, never quoting it (a spec dir entry may link to any file root can read).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pycri import conffiles, parsefail
from pycri.cdi import edits as edits_mod
from pycri.cdi import names
from pycri.cdi.schema import ContainerEdits, DeviceNode, Spec, SpecError, parse_spec
from pycri.devices import device_info
from pycri.errors import InvalidArgument

SUFFIXES = (".json", ".yaml")
MAX_NODES = 200_000  # decoded values in one document: YAML aliases may multiply a small file


@dataclass(frozen=True)
class _Loaded:
    """One spec file as last read: its stat signature and the spec or what is wrong."""

    sig: tuple[int, int, int, int]
    spec: Spec | None = None
    kind: str = ""  # known even when the spec is invalid, if the document names one
    error: str = ""


def _count(value: Any, budget: list[int]) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise SpecError(f"more than {MAX_NODES} values (YAML aliases expanding?)")
    if isinstance(value, dict):
        for k, v in value.items():
            _count(k, budget)
            _count(v, budget)
    elif isinstance(value, list):
        for v in value:
            _count(v, budget)


def decode(path: str, data: bytes) -> Any:
    """A spec file's document: JSON for .json, YAML (safe_load) for .yaml."""
    import yaml  # on the first spec read: a node without CDI specs does not carry it

    try:
        doc = json.loads(data) if path.endswith(".json") else yaml.safe_load(data)
        _count(doc, [MAX_NODES])
    except RecursionError:
        raise SpecError("nested too deeply") from None
    except (ValueError, yaml.YAMLError) as e:
        if isinstance(e, SpecError):
            raise
        raise SpecError(parsefail.invalid("JSON" if path.endswith(".json") else "YAML", e)
                        ) from None
    return doc


class Registry:
    """Resolves CDI device names against the spec files in `dirs` (lowest priority first)."""

    def __init__(self, dirs: Sequence[str], max_spec_bytes: int, max_spec_files: int) -> None:
        self.dirs = list(dirs)
        self.max_spec_bytes = max_spec_bytes
        self.max_spec_files = max_spec_files
        self._lock = threading.Lock()
        self._files: dict[str, _Loaded] = {}

    def reconfigure(self, dirs: Sequence[str], max_spec_bytes: int, max_spec_files: int) -> None:
        """New dirs and bounds (a reload), used from the next resolve; what was read
        under the old bounds is read again."""
        with self._lock:
            self.dirs = list(dirs)
            self.max_spec_bytes = max_spec_bytes
            self.max_spec_files = max_spec_files
            self._files = {}

    # -- loading -------------------------------------------------------------------

    def _load(self, path: str, sig: tuple[int, int, int, int]) -> _Loaded:
        kind = ""
        try:
            if sig[2] > self.max_spec_bytes:
                raise SpecError(f"larger than {self.max_spec_bytes} bytes")
            # The conffiles door: a FIFO swapped in after the listing cannot hang the
            # thread, and the bound holds while reading.
            data = conffiles.read_bytes(path, self.max_spec_bytes)
            doc = decode(path, data)
            if isinstance(doc, dict) and isinstance(doc.get("kind"), str):
                kind = doc["kind"]
            return _Loaded(sig, spec=parse_spec(doc), kind=kind)
        except SpecError as e:
            return _Loaded(sig, kind=kind, error=str(e))
        except OSError as e:
            return _Loaded(sig, error=e.strerror or str(e))

    def _scan(self) -> tuple[list[list[str]], list[str]]:
        """Spec paths per dir (by name), refreshing changed files; dir-level problems."""
        seen: dict[str, _Loaded] = {}
        per_dir: list[list[str]] = []
        problems: list[str] = []
        for d in self.dirs:
            paths: list[str] = []
            try:
                with os.scandir(d) as it:
                    entries = sorted((e for e in it if e.name.endswith(SUFFIXES)),
                                     key=lambda e: e.name)
            except FileNotFoundError:
                entries = []
            except OSError as err:
                problems.append(f"CDI spec dir {d}: {err.strerror}")
                entries = []
            if len(entries) > self.max_spec_files:
                problems.append(f"CDI spec dir {d}: more than {self.max_spec_files} spec files")
                entries = []
            for e in entries:
                try:
                    st = e.stat()  # follows symlinks, as a spec may be one
                except OSError:
                    continue  # removed since the listing
                if not e.is_file():
                    continue
                sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                old = self._files.get(e.path)
                seen[e.path] = old if old is not None and old.sig == sig else self._load(
                    e.path, sig)
                paths.append(e.path)
            per_dir.append(paths)
        self._files = seen
        return per_dir, problems

    # -- resolving -----------------------------------------------------------------

    def resolve(self, devices: Sequence[str]) -> list[ContainerEdits]:
        """The edits for `devices` (gate-checked names), in the CDI order; device nodes
        completed from the host. Unknown devices, conflicts, bad files: InvalidArgument."""
        wanted = list(dict.fromkeys(devices))
        if not wanted:
            return []
        with self._lock:
            per_dir, problems = self._scan()
            files = dict(self._files)
        if problems:
            raise InvalidArgument("; ".join(problems))
        # device -> (dir index, files defining it in that dir); later dirs replace.
        index: dict[str, tuple[int, list[str]]] = {}
        for i, paths in enumerate(per_dir):
            for p in paths:
                spec = files[p].spec
                if spec is None:
                    continue
                for dev in spec.devices:
                    q = f"{spec.kind}={dev.name}"
                    at = index.get(q)
                    if at is not None and at[0] == i:
                        at[1].append(p)
                    else:
                        index[q] = (i, [p])
        out: list[ContainerEdits] = []
        applied: set[str] = set()
        for device in wanted:
            kind, name = names.split(device)
            bad = [f"{p}: {f.error}" for p, f in files.items() if f.error and f.kind == kind]
            if bad:
                raise InvalidArgument(f"CDI device {device}: invalid spec file {'; '.join(bad)}")
            hit = index.get(device)
            if hit is None:
                unread = [f"{p}: {f.error}" for p, f in files.items() if f.error and not f.kind]
                extra = f" (unreadable spec files: {'; '.join(unread)})" if unread else ""
                raise InvalidArgument(f"unknown CDI device {device}: no spec file in "
                                      f"{', '.join(self.dirs)} defines it{extra}")
            if len(hit[1]) > 1:
                raise InvalidArgument(f"CDI device {device} is defined by more than one spec "
                                      f"file: {', '.join(hit[1])}")
            path = hit[1][0]
            spec = files[path].spec
            assert spec is not None
            if path not in applied:
                applied.add(path)
                out.append(_complete(spec.edits, device))
            out.append(_complete(next(d for d in spec.devices if d.name == name).edits, device))
        return out

    def inject(self, doc: Mapping[str, Any], devices: list[str]) -> dict[str, Any]:
        """`doc` with `devices` injected: the shape NRI's adjustment takes as its resolver."""
        for device in devices:
            if problem := names.qualified_problem(device):
                raise InvalidArgument(problem)
        return edits_mod.apply(doc, self.resolve(devices))


def _complete(e: ContainerEdits, device: str) -> ContainerEdits:
    """Device nodes with type, major and minor (and mode) read from the host node
    when the spec leaves them out."""
    if not e.device_nodes:
        return e
    return replace(e, device_nodes=tuple(_node(d, device) for d in e.device_nodes))


def _node(d: DeviceNode, device: str) -> DeviceNode:
    if d.type == "p":
        return replace(d, major=d.major or 0, minor=d.minor or 0)
    if d.type and d.major is not None:
        return replace(d, minor=d.minor or 0)
    host = d.host_path or d.path
    try:
        info = device_info(host, d.path, d.permissions or "rwm")
    except InvalidArgument as e:
        raise InvalidArgument(f"CDI device {device}: device node {d.path}: {e}") from None
    if d.type and d.type != info.type and (d.type, info.type) != ("u", "c"):
        raise InvalidArgument(f"CDI device {device}: device node {d.path} is type "
                              f"{d.type!r} in the spec but {info.type!r} on the host ({host})")
    return replace(d, type=d.type or info.type,
                   major=info.major if d.major is None else d.major,
                   minor=info.minor if d.minor is None else d.minor,
                   file_mode=info.file_mode if d.file_mode is None else d.file_mode)
