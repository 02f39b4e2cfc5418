"""The pipe between a layer's download and its unpack: order, bound, both ends' exits."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pycri.image.pipe import Aborted, Pipe, own_thread


async def test_bytes_arrive_in_order_and_end_after_finish() -> None:
    pipe = Pipe(1 << 20)
    for part in (b"abc", b"defg", b"h"):
        assert await pipe.put(part)
    assert pipe.read(2) == b"ab"
    assert pipe.read(3) == b"cde"  # across a chunk boundary
    buf = bytearray(10)
    assert pipe.readinto(buf) == 3 and bytes(buf[:3]) == b"fgh"
    pipe.finish()
    assert pipe.read(5) == b"" and pipe.taken == 8


async def test_a_full_pipe_makes_the_download_wait_without_a_thread() -> None:
    pipe = Pipe(4)
    assert await pipe.put(b"1234")
    waiting = asyncio.ensure_future(pipe.put(b"5678"))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # nothing past the bound is queued
    assert await asyncio.to_thread(pipe.read, 2) == b"12"
    assert await asyncio.wait_for(waiting, 5) is True
    assert pipe.read() == b"345678"


async def test_a_reader_blocks_until_bytes_come() -> None:
    pipe = Pipe(1 << 20)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read(10)))
    reader.start()
    await asyncio.sleep(0.1)
    assert reader.is_alive()
    await pipe.put(b"late")
    await asyncio.to_thread(reader.join, 5)
    assert got == [b"late"]


async def test_fail_reaches_the_reader_and_drops_what_is_queued() -> None:
    pipe = Pipe(1 << 20)
    await pipe.put(b"data")
    pipe.fail(Aborted())
    with pytest.raises(Aborted):
        pipe.read(4)


async def test_close_frees_a_waiting_download() -> None:
    pipe = Pipe(1)
    assert await pipe.put(b"x")
    waiting = asyncio.ensure_future(pipe.put(b"y"))
    await asyncio.sleep(0.05)
    await asyncio.to_thread(pipe.close)
    assert await asyncio.wait_for(waiting, 5) is False
    assert pipe.closed and await pipe.put(b"z") is False


async def test_own_thread_gives_result_and_error() -> None:
    assert await own_thread(lambda: 42, "t") == 42

    def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await own_thread(boom, "t")


async def test_own_thread_cancelled_waits_for_its_work_to_end() -> None:
    pipe = Pipe(1 << 20)
    ended: list[float] = []

    def work() -> bytes:
        try:
            return pipe.read(1)
        finally:
            ended.append(time.monotonic())

    task = asyncio.ensure_future(own_thread(work, "t"))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.sleep(0.1)
    assert not task.done()  # the thread still runs: the cancel waits for it
    pipe.fail(Aborted())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended
