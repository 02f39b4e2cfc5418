"""The parts of an OCI image config that shape the container process, parsed from
untrusted JSON (a wrong type is InvalidArgument, never a crash)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pycri.errors import InvalidArgument


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config that shape the container process."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""
    stop_signal: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_oci(cls, config_json: Mapping[str, Any]) -> ImageConfig:
        """Accept a whole image config (with "config") or its inner object; reject bad types.

        Images are untrusted input, so a wrong type is InvalidArgument, not a crash.
        """
        inner = config_json.get("config", config_json)
        if inner is None:
            return cls()
        if not isinstance(inner, Mapping):
            raise InvalidArgument("image config: 'config' is not an object")

        def strings(key: str) -> tuple[str, ...]:
            v = inner.get(key)
            if v is None:
                return ()
            if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
                raise InvalidArgument(f"image config: {key!r} must be a list of strings")
            return tuple(v)

        def string(key: str) -> str:
            v = inner.get(key)
            if v is None:
                return ""
            if not isinstance(v, str):
                raise InvalidArgument(f"image config: {key!r} must be a string")
            return v

        labels = inner.get("Labels") or {}
        if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise InvalidArgument("image config: 'Labels' must map strings to strings")
        return cls(
            entrypoint=strings("Entrypoint"),
            cmd=strings("Cmd"),
            env=strings("Env"),
            working_dir=string("WorkingDir"),
            user=string("User"),
            stop_signal=string("StopSignal"),
            labels=dict(labels),
        )
