"""A stored record's fields checked against its dataclass before the object is built:
the one place a row becomes a typed record (issue 38). A field of the wrong type would
otherwise be carried until a status call tripped on it (INTERNAL); now the row is set
aside at load (Store.load) with the field named, and every other record is served.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Any

INT64 = 2**63


def _text(v: object) -> bool:
    """Text a protobuf string can carry: UTF-8 (JSON's escapes can spell a lone
    surrogate, which is not)."""
    if not isinstance(v, str):
        return False
    try:
        v.encode()
    except UnicodeEncodeError:
        return False
    return True


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -INT64 <= v < INT64


def _fits(v: object, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is int:
        return _int(v)
    if tp is str:
        return _text(v)
    if tp is bool:
        return isinstance(v, bool)
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(v, list) and all(_fits(x, item) for x in v)
    if origin is dict:
        key, value = typing.get_args(tp)
        return isinstance(v, dict) and all(_fits(k, key) and _fits(x, value)
                                           for k, x in v.items())
    return True  # Any, and the messages the caller decodes itself


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check(cls: type, data: Mapping[str, Any], what: str) -> None:
    """TypeError naming the first of `data`'s fields that is not what `cls` declares
    (a field `cls` does not have included); missing fields are left to `cls`."""
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key not in names:
            raise TypeError(f"{what}: unknown field {key[:64]!r}")
        if not _fits(value, hints[key]):
            raise TypeError(f"{what}: field {key} is not {_name(hints[key])}")


def _name(tp: Any) -> str:
    return str(tp) if typing.get_origin(tp) else getattr(tp, "__name__", str(tp))
