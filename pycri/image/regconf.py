"""containers-registries.conf v2: mirrors, insecure and blocked registries.

The same TOML file CRI-O, podman, skopeo and buildah read, so an operator's
mirror set-up applies to pycri unchanged. Only the keys a pull needs are used:
`[[registry]]` prefix/location/insecure/blocked/mirror-by-digest-only and
`[[registry.mirror]]` location/insecure; drop-ins in the `.d` directory are
applied in lexical order, a later `[[registry]]` with the same prefix replacing
the earlier one.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pycri import conffiles, errors
from pycri.image.reference import DOCKER_HUB, DOCKER_HUB_ENDPOINT, Reference

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoint:
    """One place to fetch a repository from: `host` (with port) and the path there."""

    host: str
    repository: str
    insecure: bool
    mirror: bool

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_ENDPOINT if self.host == DOCKER_HUB else self.host


@dataclass
class _Mirror:
    location: str
    insecure: bool = False
    pull_from_mirror: str = "all"


@dataclass
class _Registry:
    prefix: str
    location: str
    insecure: bool = False
    blocked: bool = False
    mirror_by_digest_only: bool = False
    mirrors: list[_Mirror] = field(default_factory=list)


def is_loopback(host: str) -> bool:
    """localhost and 127.0.0.0/8 (and ::1) may be reached over plain http."""
    name = host
    if name.startswith("["):
        name = name[1 : name.find("]")]
    elif name.count(":") == 1:
        name = name.split(":")[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _bool(table: dict[str, Any], key: str, where: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise errors.InvalidArgument(f"{where}: {key} must be a boolean")
    return value


def _str(table: dict[str, Any], key: str, where: str) -> str:
    value = table.get(key, "")
    if not isinstance(value, str):
        raise errors.InvalidArgument(f"{where}: {key} must be a string")
    return value.rstrip("/")


def _tables(value: Any, where: str) -> list[dict[str, Any]]:
    """An array of tables (`[[registry]]`, `[[registry.mirror]]`), else InvalidArgument."""
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise errors.InvalidArgument(f"{where}: must be an array of tables")
    return value


def _parse_registry(table: dict[str, Any], where: str) -> _Registry:
    location = _str(table, "location", where)
    prefix = _str(table, "prefix", where) or location
    if not prefix:
        raise errors.InvalidArgument(f"{where}: [[registry]] needs a prefix or a location")
    mirrors = []
    for i, m in enumerate(_tables(table.get("mirror", []), f"{where} mirror")):
        mw = f"{where} mirror[{i}]"
        loc = _str(m, "location", mw)
        if not loc:
            raise errors.InvalidArgument(f"{mw}: location must be set")
        mirrors.append(_Mirror(loc, _bool(m, "insecure", mw), m.get("pull-from-mirror", "all")))
    return _Registry(
        prefix=prefix,
        location=location or prefix,
        insecure=_bool(table, "insecure", where),
        blocked=_bool(table, "blocked", where),
        mirror_by_digest_only=_bool(table, "mirror-by-digest-only", where),
        mirrors=mirrors,
    )


def _prefix_matches(prefix: str, name: str) -> int:
    """Length of the match of `prefix` against `name` (0 for none); `*.` wildcards allowed."""
    if prefix.startswith("*."):
        host = name.split("/", 1)[0]
        return len(prefix) if host.endswith(prefix[1:]) else 0
    if name == prefix:
        return len(prefix)
    if name.startswith(prefix) and name[len(prefix)] in "/:@":
        return len(prefix)
    return 0


_skipped: dict[str, float] = {}  # drop-ins reported as skipped, by path: their mtime


def _skip(f: Path, message: str) -> None:
    """Report a skipped drop-in once per version of it (every pull reads the files)."""
    try:
        mtime = f.lstat().st_mtime
    except OSError:
        mtime = 0.0
    if _skipped.get(str(f)) != mtime:
        _skipped[str(f)] = mtime
        log.warning("%s; skipped", message)


class RegistriesConf:
    """Parsed registries.conf (+ drop-ins); resolves a reference to ordered endpoints."""

    def __init__(self, registries: list[_Registry]) -> None:
        self._registries = registries

    @classmethod
    def load(cls, path: str, dropin_dir: str = "") -> RegistriesConf:
        """Read the file and its drop-ins; absent files mean no configuration."""
        files = [Path(path)] if path else []
        if dropin_dir and Path(dropin_dir).is_dir():
            files += sorted(Path(dropin_dir).glob("*.conf"))
        by_prefix: dict[str, _Registry] = {}
        for n, f in enumerate(files):
            try:
                data = conffiles.load_toml(f)  # named, never quoted: it may link anywhere
                regs = [_parse_registry(table, f"{f} registry[{i}]") for i, table in
                        enumerate(_tables(data.get("registry", []), f"{f} registry"))]
            except FileNotFoundError:
                continue
            except (OSError, ValueError, errors.InvalidArgument) as e:
                why = conffiles.reason(e)
                message = why if why.startswith(str(f)) else f"registries config {f}: {why}"
                if n == 0 and path:  # the operator's main file: every pull says so
                    raise errors.InvalidArgument(message) from None
                _skip(f, message)  # a bad drop-in is skipped, as containers-registries does
                continue
            for reg in regs:
                by_prefix[reg.prefix] = reg
        return cls(list(by_prefix.values()))

    def _match(self, name: str) -> _Registry | None:
        best: tuple[int, _Registry | None] = (0, None)
        for reg in self._registries:
            n = _prefix_matches(reg.prefix, name)
            if n > best[0]:
                best = (n, reg)
        return best[1]

    def endpoints(self, ref: Reference) -> list[Endpoint]:
        """Mirrors in order, then the registry itself; raises if the registry is blocked."""
        name = ref.repository
        reg = self._match(name)
        if reg is None:
            return [Endpoint(ref.domain, ref.path, False, False)]
        if reg.blocked:
            raise errors.FailedPrecondition(f"registry for {ref} is blocked in registries.conf")
        if reg.prefix.startswith("*."):
            rest, base = name.split("/", 1)[1], None
        else:
            rest, base = name[len(reg.prefix) :].lstrip("/"), reg.prefix
        out = []
        by_tag = ref.digest is None
        for m in reg.mirrors:
            if (reg.mirror_by_digest_only or m.pull_from_mirror == "digest-only") and by_tag:
                continue
            if m.pull_from_mirror == "tag-only" and not by_tag:
                continue
            out.append(_endpoint(m.location, rest, m.insecure, True))
        location = reg.location if base is not None else ref.domain
        out.append(_endpoint(location, rest, reg.insecure, False))
        return out


def _endpoint(location: str, rest: str, insecure: bool, mirror: bool) -> Endpoint:
    host, _, base = location.partition("/")
    repo = f"{base}/{rest}" if base else rest
    if host == DOCKER_HUB and "/" not in repo:
        repo = f"library/{repo}"
    return Endpoint(host, repo, insecure, mirror)
