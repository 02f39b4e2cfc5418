"""Seccomp profiles: the bundled default allowlist, Localhost files, capability gating.

The bundled profile (pycri/data/seccomp-default.json) is OCI `linux.seccomp` plus two
pycri-only rule keys that let one file serve every capability set:
  "capabilities": [...]        keep the rule only if the container has ANY of them;
  "unlessCapabilities": [...]  keep the rule only if it has NONE of them.
`for_capabilities` evaluates and strips them, so runc/crun only ever see plain OCI.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pycri import conffiles
from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.resources import data_path

DEFAULT_PROFILE_PATH = data_path("seccomp-default.json")

_CAP_KEY = "capabilities"
_UNLESS_KEY = "unlessCapabilities"
_MAX_PROFILE_BYTES = 1 << 20


def _validate(profile: Any, origin: str) -> dict[str, Any]:
    """Reject what runc/crun would only fail on later, so the error names the file."""
    if not isinstance(profile, dict):
        raise InvalidArgument(f"seccomp profile {origin}: not a JSON object")
    if not isinstance(profile.get("defaultAction"), str):
        raise InvalidArgument(f"seccomp profile {origin}: missing string 'defaultAction'")
    for key in ("architectures", "flags", "syscalls"):
        if key in profile and not isinstance(profile[key], list):
            raise InvalidArgument(f"seccomp profile {origin}: {key!r} must be a list")
    for i, rule in enumerate(profile.get("syscalls", [])):
        if not isinstance(rule, dict) or not isinstance(rule.get("action"), str):
            raise InvalidArgument(f"seccomp profile {origin}: syscalls[{i}] needs an 'action'")
        names = rule.get("names")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise InvalidArgument(f"seccomp profile {origin}: syscalls[{i}].names must be strings")
    return profile


def read_profile(path: str | Path) -> dict[str, Any]:
    """Load and sanity-check a profile file; any problem is InvalidArgument naming the path.

    Read at the conffiles door: a regular file only, opened without blocking (a FIFO
    would stall the reader), at most _MAX_PROFILE_BYTES, JSON nested at most 64 deep.
    Blocks on the filesystem: call in a thread.
    """
    try:
        profile = conffiles.load_json(path, _MAX_PROFILE_BYTES)
    except (OSError, ValueError) as e:
        raise InvalidArgument(f"seccomp profile {path}: {conffiles.reason(e)}") from None
    return _validate(profile, str(path))


def default_profile(path: str | Path = DEFAULT_PROFILE_PATH) -> dict[str, Any]:
    """The RuntimeDefault profile, still carrying its capability conditions."""
    return read_profile(path)


def _localhost(ref: str) -> dict[str, Any]:
    if not ref.startswith("/"):
        raise InvalidArgument(f"seccomp localhost profile {ref!r}: path must be absolute")
    return read_profile(ref)


def load_profile(
    profile: pb.SecurityProfile | None,
    legacy_path: str,
    default_path: str | Path = DEFAULT_PROFILE_PATH,
) -> dict[str, Any] | None:
    """Turn the CRI seccomp choice into a profile dict, or None for unconfined.

    Pass `profile=None` when the security context has no `seccomp` field set; then the
    deprecated string form decides, and an empty string means unconfined (what the
    kubelet and critest expect when nothing is asked for).
    """
    if profile is not None:
        kind = profile.profile_type
        if kind == pb.SecurityProfile.RuntimeDefault:
            return default_profile(default_path)
        if kind == pb.SecurityProfile.Unconfined:
            return None
        if kind == pb.SecurityProfile.Localhost:
            return _localhost(profile.localhost_ref)
        raise InvalidArgument(f"unknown seccomp profile type {kind}")
    if legacy_path in ("", "unconfined"):
        return None
    if legacy_path in ("runtime/default", "docker/default"):
        return default_profile(default_path)
    if legacy_path.startswith("localhost/"):
        return _localhost(legacy_path.removeprefix("localhost"))
    raise InvalidArgument(f"unknown seccomp profile {legacy_path!r}")


def for_capabilities(profile: dict[str, Any], capabilities: Iterable[str]) -> dict[str, Any]:
    """The profile a container with these capabilities gets: gated rules resolved, keys gone."""
    caps = set(capabilities)
    out = copy.deepcopy(profile)
    rules: list[dict[str, Any]] = []
    for rule in out.get("syscalls", []):
        need = rule.pop(_CAP_KEY, None)
        unless = rule.pop(_UNLESS_KEY, None)
        if need and not caps.intersection(need):
            continue
        if unless and caps.intersection(unless):
            continue
        rules.append(rule)
    if "syscalls" in out:
        out["syscalls"] = rules
    return out
