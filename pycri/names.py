"""IDs and selectors: 64-hex IDs, unique-prefix lookup, label selectors.

The kubelet addresses pods and containers by ID, crictl by any unique prefix
(store/records.py holds the records and the names they reserve).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from typing import Protocol, TypeVar

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument, NotFound


def new_id() -> str:
    """A container/sandbox ID: 32 random bytes as 64 hex digits, like the others do."""
    return secrets.token_hex(32)


def resolve_prefix(prefix: str, ids: Iterable[str], what: str) -> str:
    """The one ID starting with `prefix`: NotFound for none, InvalidArgument for several
    (so Stop/Remove, which succeed for unknown IDs, never succeed on an ambiguous one)."""
    if not prefix:
        raise NotFound(f"{what} ID is empty")
    matches = [i for i in ids if i.startswith(prefix)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise NotFound(f"{what} {prefix!r} not found")
    raise InvalidArgument(f"{what} ID prefix {prefix!r} is ambiguous ({len(matches)} matches)")


class Listed(Protocol):
    """A pod or container record, as a List call's filter sees it."""

    @property
    def id(self) -> str: ...

    @property
    def config(self) -> pb.PodSandboxConfig | pb.ContainerConfig: ...


L = TypeVar("L", bound=Listed)


def filtered(records: list[L], id_prefix: str, selector: Mapping[str, str]) -> list[L]:
    """The records whose ID starts with `id_prefix` and whose labels hold every key of
    `selector` with its value (CRI label selectors are plain equality)."""
    if id_prefix:
        records = [r for r in records if r.id.startswith(id_prefix)]
    if selector:
        records = [r for r in records
                   if all(r.config.labels.get(k) == v for k, v in selector.items())]
    return records
