"""pycri/together.py: how steps run at once fail and end (pure asyncio)."""

from __future__ import annotations

import asyncio

import pytest

from pycri.together import sparing


class Boom(Exception):
    pass


async def _fail_after(seconds: float) -> None:
    await asyncio.sleep(seconds)
    raise Boom("the other step failed")


async def _recorded(ended: list[str], seconds: float) -> None:
    try:
        await asyncio.sleep(seconds)
        ended.append("finished")
    except asyncio.CancelledError:
        ended.append("cancelled")
        raise


def test_a_failing_sibling_lets_the_spared_step_finish_first() -> None:
    ended: list[str] = []

    async def run() -> None:
        with pytest.raises(Boom):
            await sparing(_recorded(ended, 0.2), _fail_after(0.01))

    asyncio.run(run())
    assert ended == ["finished"]


def test_a_failing_spared_step_cuts_the_other_short() -> None:
    ended: list[str] = []

    async def run() -> None:
        with pytest.raises(Boom):
            await sparing(_fail_after(0.01), _recorded(ended, 5))

    asyncio.run(run())
    assert ended == ["cancelled"]


def test_a_cancel_from_outside_cuts_both() -> None:
    spared: list[str] = []
    other: list[str] = []

    async def run() -> None:
        task = asyncio.ensure_future(sparing(_recorded(spared, 5), _recorded(other, 5)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert (spared, other) == (["cancelled"], ["cancelled"])


def test_a_cancel_while_sparing_cuts_the_spared_step_too() -> None:
    spared: list[str] = []

    async def run() -> None:
        task = asyncio.ensure_future(sparing(_recorded(spared, 5), _fail_after(0.01)))
        await asyncio.sleep(0.1)  # the other has failed; the spared one still runs
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert spared == ["cancelled"]
