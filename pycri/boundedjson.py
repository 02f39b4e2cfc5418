"""JSON from a source pycri does not trust (a stored row, an archive's metadata),
decoded with bounds checked before the parser runs: its size, and how deep its arrays
and objects nest (Python's parser recurses once per level, so a deep enough document
is a RecursionError, which no caller expects).
"""

from __future__ import annotations

import json
import re
from typing import Any

# A string (escapes included) or a bracket: brackets inside strings do not count.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[][{}]')


class BoundsError(ValueError):
    """The text is larger or nests deeper than allowed; never parsed."""


def nesting(text: str, limit: int) -> int:
    """How deep `text`'s arrays and objects nest, counting stopped past `limit`."""
    depth = deepest = 0
    for m in _TOKENS.finditer(text):
        c = m.group()[0]
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif c in "]}":
            depth -= 1
    return deepest


def loads(text: str | bytes, max_bytes: int, max_depth: int) -> Any:
    """`json.loads`, or BoundsError (a ValueError, as json's own errors are) when the
    text is over `max_bytes` or nests deeper than `max_depth`."""
    if len(text) > max_bytes:
        raise BoundsError(f"is larger than {max_bytes} bytes")
    if isinstance(text, bytes):
        text = text.decode()
    if nesting(text, max_depth) > max_depth:
        raise BoundsError(f"nests deeper than {max_depth} levels")
    return json.loads(text)
