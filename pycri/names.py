"""IDs and selectors: 64-hex IDs, unique-prefix lookup, label selectors.

The kubelet addresses pods and containers by ID, crictl by any unique prefix
(store/records.py holds the records and the names they reserve).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
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
    def state(self) -> int: ...

    @property
    def config(self) -> pb.PodSandboxConfig | pb.ContainerConfig: ...


L = TypeVar("L", bound=Listed)
Filter = (pb.PodSandboxFilter | pb.PodSandboxStatsFilter | pb.ContainerFilter
          | pb.ContainerStatsFilter)


def filtered(records: list[L], flt: Filter) -> list[L]:
    """The records a List call's filter lets through: ID prefix, state (where the filter
    has one) and labels holding every key of the selector with its value (CRI label
    selectors are plain equality)."""
    if flt.id:
        records = [r for r in records if r.id.startswith(flt.id)]
    if "state" in flt.DESCRIPTOR.fields_by_name and flt.HasField("state"):
        records = [r for r in records if r.state == flt.state.state]  # type: ignore[union-attr]
    if flt.label_selector:
        records = [r for r in records if all(r.config.labels.get(k) == v
                                             for k, v in flt.label_selector.items())]
    return records
