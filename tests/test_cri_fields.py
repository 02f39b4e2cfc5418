"""docs/cri-fields.md against the compiled CRI descriptors: every field of every message
has exactly one row, in proto order, with a disposition a reader can check."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
from google.protobuf.descriptor import Descriptor

from pycri.api import api_pb2

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "docs" / "cri-fields.md"
ROW = re.compile(r"^\| `([A-Za-z0-9_.]+)` \| ([^|]+?) \| (.+) \|$")
DISPOSITIONS = re.compile(r"honoured|refused|n/a|ignored|gap|issue \d+")
MODULE = re.compile(r"pycri/[\w/]+\.py")
CODES = {c.name for c in grpc.StatusCode}


def _walk(d: Descriptor, prefix: str = "") -> Iterator[str]:
    name = prefix + d.name
    for f in d.fields:
        yield f"{name}.{f.name}"
    for nested in d.nested_types:
        if not nested.GetOptions().map_entry:  # a map's entry is its map field's row
            yield from _walk(nested, name + ".")


def proto_fields() -> list[str]:
    """`Message.field` (nested: `Outer.Inner.field`) in proto order."""
    return [f for m in api_pb2.DESCRIPTOR.message_types_by_name.values() for f in _walk(m)]


@functools.cache
def rows() -> list[tuple[str, str, str]]:
    out = []
    for line in TABLE.read_text().splitlines():
        m = ROW.match(line)
        if m:
            out.append((m.group(1), m.group(2).strip(), m.group(3).strip()))
    return out


@functools.cache
def _source(module: str) -> str:
    return (REPO / module).read_text()


def test_every_field_has_exactly_one_row_in_proto_order() -> None:
    fields = proto_fields()
    named = [name for name, _, _ in rows()]
    assert not (missing := sorted(set(fields) - set(named))), f"fields without a row: {missing}"
    assert not (unknown := sorted(set(named) - set(fields))), f"rows naming no field: {unknown}"
    dups = sorted({n for n in named if named.count(n) > 1})
    assert not dups, f"fields with more than one row: {dups}"
    assert named == fields, "rows are not in proto order"


def test_every_row_has_a_disposition_and_a_reason() -> None:
    for name, disposition, text in rows():
        assert DISPOSITIONS.fullmatch(disposition), f"{name}: unknown disposition {disposition!r}"
        assert len(text) > 10, f"{name}: says nothing about what pycri does"
        if disposition == "refused":
            assert CODES & set(re.findall(r"[A-Z_]{4,}", text)), f"{name}: names no gRPC code"
        if disposition.startswith("issue"):
            assert "today" in text, f"{name}: does not say what pycri does today"


def test_honoured_rows_name_modules_that_handle_the_field() -> None:
    for name, disposition, text in rows():
        if disposition != "honoured":
            continue
        modules = MODULE.findall(text)
        assert modules, f"{name}: honoured by which module?"
        for module in modules:
            assert (REPO / module).is_file(), f"{name}: {module} does not exist"
        field = name.rsplit(".", 1)[1]
        word = re.compile(rf"\b{re.escape(field)}\b", re.IGNORECASE)
        assert any(word.search(_source(m)) for m in modules), (
            f"{name}: none of {modules} mentions {field!r}")


def test_the_walk_sees_nested_messages_and_skips_map_entries() -> None:
    fields = proto_fields()
    assert "PsiStats.Full" in fields and "PsiData.Avg10" in fields
    assert "PodSandboxConfig.labels" in fields
    assert not [f for f in fields if ".LabelsEntry." in f or f.endswith("Entry.key")]
