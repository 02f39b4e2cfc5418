"""The container process: argv, environment, working directory, user and groups,
rlimits and oom_score_adj (Docker's ENTRYPOINT/CMD rules against the CRI request)."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci.spec.image import ImageConfig
from pycri.oci.users import ResolvedUser

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Rlimit:
    type: str  # e.g. "RLIMIT_NOFILE"
    soft: int
    hard: int


def process_args(command: Sequence[str], args: Sequence[str], image: ImageConfig) -> list[str]:
    """Docker semantics: command replaces ENTRYPOINT and drops CMD; args replace CMD."""
    if command:
        out = list(command) + list(args)
    else:
        out = list(image.entrypoint) + (list(args) if args else list(image.cmd))
    if not out:
        raise InvalidArgument("no command specified: neither the request nor the image has one")
    return out


def _decode(value: str | bytes) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def process_env(
    image_env: Iterable[str], cri_env: Iterable[pb.KeyValue], hostname: str = ""
) -> list[str]:
    """Default PATH, HOSTNAME, image env, CRI env (the request's envs): later wins, first
    position kept."""
    env: dict[str, str] = {}

    def put(entry: str) -> None:
        key, _, value = entry.partition("=")
        if key:
            env[key] = value

    put(DEFAULT_PATH)
    if hostname:
        put(f"HOSTNAME={hostname}")
    for entry in image_env:
        put(entry)
    for kv in cri_env:
        if not kv.key or "=" in kv.key:
            raise InvalidArgument(f"invalid environment variable name {kv.key!r}")
        value = _decode(kv.value)
        if "\0" in kv.key or "\0" in value:
            raise InvalidArgument(f"environment variable {kv.key!r} contains a NUL byte")
        env[kv.key] = value
    return [f"{k}={v}" for k, v in env.items()]


def working_dir(requested: str, image: ImageConfig) -> str:
    cwd = requested or image.working_dir or "/"
    if not cwd.startswith("/"):
        raise InvalidArgument(f"working directory {cwd!r} must be absolute")
    return posixpath.normpath(cwd).replace("//", "/")


def oci_user(u: ResolvedUser) -> dict[str, Any]:
    """process.user: the resolved IDs, with the supplementary groups when there are any."""
    out: dict[str, Any] = {"uid": u.uid, "gid": u.gid}
    if u.additional_gids:
        out["additionalGids"] = list(u.additional_gids)
    return out


def oci_rlimits(rlimits: Iterable[Rlimit]) -> list[dict[str, Any]]:
    return [{"type": r.type, "soft": r.soft, "hard": r.hard} for r in rlimits]


def clamp_oom_score_adj(requested: int, minimum: int) -> int:
    """Never below the daemon's own value (no CAP_SYS_RESOURCE), within the kernel range."""
    return min(1000, max(requested, minimum, -1000))
