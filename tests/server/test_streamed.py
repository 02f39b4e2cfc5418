"""How the Stream* lists cut an answer: by count, by serialized size, in order."""

from __future__ import annotations

from pycri.api import api_pb2 as pb
from pycri.config import ListsConfig
from pycri.server.streamed import chunked


def _container(n: int, label_bytes: int = 0) -> pb.Container:
    return pb.Container(id=f"c{n:04d}", labels={"pad": "x" * label_bytes} if label_bytes else {})


def test_count_bound_keeps_order() -> None:
    items = [_container(n) for n in range(12)]
    chunks = list(chunked(items, ListsConfig(stream_chunk_items=5, stream_chunk_bytes=1 << 20)))
    assert [len(c) for c in chunks] == [5, 5, 2]
    assert [c for chunk in chunks for c in chunk] == items


def test_size_bound_and_an_oversized_item_alone() -> None:
    limits = ListsConfig(stream_chunk_items=1000, stream_chunk_bytes=2048)
    items = [_container(n, 600) for n in range(7)] + [_container(99, 5000), _container(100)]
    chunks = list(chunked(items, limits))
    for chunk in chunks:
        wire = pb.StreamContainersResponse(containers=chunk).ByteSize()
        assert wire <= limits.stream_chunk_bytes or len(chunk) == 1
    assert [len(c) for c in chunks] == [3, 3, 1, 1, 1]
    assert [c for chunk in chunks for c in chunk] == items


def test_nothing_to_send_sends_nothing() -> None:
    assert list(chunked([], ListsConfig())) == []
