"""IDs and selectors: 64-hex IDs, unique-prefix lookup, label selectors.

The kubelet addresses pods and containers by ID, crictl by any unique prefix
(store/records.py holds the records and the names they reserve).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

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


def matches_labels(labels: dict[str, str], selector: dict[str, str]) -> bool:
    """CRI label selectors are plain equality on every given key."""
    return all(labels.get(k) == v for k, v in selector.items())
