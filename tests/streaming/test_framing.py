"""Framing chosen by a hostile peer (issue 22, part 5), without a daemon: whatever the
sizes of the messages, an inbox hands back exactly the bytes put in and holds no more
than its bound, tiny messages cost their bytes and not an object each, and the SPDY
codec parses any split of any frames one at a time."""

from __future__ import annotations

import asyncio
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from pycri.streaming import spdy
from pycri.streaming.inbox import Inbox, Pool
from pycri.streaming.limits import Rate

LIMIT = 4096


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=3 * LIMIT // 2), max_size=60),
       st.integers(min_value=-1, max_value=2 * LIMIT))  # fmt: skip
def test_an_inbox_returns_what_was_put_and_holds_its_bound(messages: list[bytes],
                                                           read_size: int) -> None:  # fmt: skip
    async def run() -> tuple[bytes, int]:
        pool = Pool(limit=2 * LIMIT)
        box = Inbox(pool, LIMIT)
        peak = 0

        async def writer() -> None:
            nonlocal peak
            for m in messages:
                await box.put(m)
                if len(box) > len(m):  # an empty inbox takes one message of any size
                    peak = max(peak, len(box))
            box.end()

        task = asyncio.create_task(writer())
        out = bytearray()
        while chunk := await box.read(read_size):
            out += chunk
            await asyncio.sleep(0)
        await task
        assert pool.used == 0
        return bytes(out), peak

    out, peak = asyncio.run(run())
    assert out == b"".join(messages)
    assert peak <= LIMIT


def test_tiny_messages_cost_their_bytes_not_an_object_each() -> None:
    # 1 MiB of two-byte messages nobody reads: queued as one `bytes` each they take 21.6
    # MiB by tracemalloc (28 MiB of RSS); in one buffer, their bytes and its growth margin.
    async def fill() -> int:
        box = Inbox(Pool())
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            for _ in range(box.limit // 2):
                await box.put(b"xy")
            now, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(box) == box.limit
        return now - base

    assert asyncio.run(fill()) < 1.25 * (1 << 20)


def test_an_ended_inbox_drops_what_comes_later_and_frees_a_waiting_put() -> None:
    async def run() -> None:
        box = Inbox(Pool(), 4)
        await box.put(b"abcd")
        waiting = asyncio.create_task(box.put(b"e"))  # no room: waits
        await asyncio.sleep(0.01)
        assert not waiting.done()
        box.end()
        await asyncio.wait_for(waiting, 1)
        assert await box.read() == b"abcd" and await box.read() == b""

    asyncio.run(run())


FRAMES = st.one_of(
    st.builds(spdy.DataFrame, st.integers(1, 1 << 20), st.binary(max_size=64), st.booleans()),
    st.builds(spdy.Ping, st.integers(0, 1 << 31)),
    st.builds(spdy.WindowUpdate, st.integers(0, 1 << 30), st.integers(1, 1 << 30)),
    st.builds(spdy.RstStream, st.integers(1, 1 << 30), st.integers(1, 11)),
    st.builds(spdy.Settings, st.lists(st.tuples(st.integers(0, 1), st.integers(1, 8),
                                                st.integers(0, 1 << 31)), max_size=8)),
    st.builds(spdy.GoAway, st.integers(0, 1 << 30), st.integers(0, 2)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(FRAMES, max_size=40), st.lists(st.integers(1, 64), max_size=20))
def test_the_codec_parses_any_split_of_frames_one_at_a_time(frames: list[spdy.Frame],
                                                            cuts: list[int]) -> None:  # fmt: skip
    wire = b"".join(spdy.Codec().encode(f) for f in frames)
    codec = spdy.Codec()
    got: list[spdy.Frame] = []
    pos = 0
    for size in [*cuts, len(wire)]:
        codec.receive(wire[pos : pos + size])
        pos += size
        for frame in codec.frames():
            got.append(frame)
    assert got == frames


def test_settings_claiming_many_entries_are_refused() -> None:
    body = (1 << 20).to_bytes(4, "big") + b"\0" * 64
    frame = b"\x80\x03\x00\x04" + len(body).to_bytes(4, "big") + body
    try:
        spdy.Codec().feed(frame)
    except spdy.SpdyError as e:
        assert "SETTINGS" in str(e)
    else:
        raise AssertionError("a SETTINGS frame claiming 1M entries was parsed")


def test_a_rate_allows_its_burst_then_its_rate() -> None:
    rate = Rate(per_second=0.001, burst=5)
    assert [rate.take() for _ in range(6)] == [True] * 5 + [False]
