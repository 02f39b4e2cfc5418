"""Independent steps of one RPC run at the same time, failing like one step.

RunPodSandbox wires the network (CNI ADD) while it creates the infra process, and
StopPodSandbox tears the network down (CNI DEL) while the infra is killed: each pair
needs only the pinned network namespace, so the call takes the longer of the two
instead of their sum (RunPodSandbox lets a started ADD finish even when the infra
fails: `sparing`). Callers keep one undo stack; each step pushes its own undo
before it acts, so whatever ran of either is undone whichever fails. A step cut
off there must not go on behind the undo's back: `in_thread` runs the worker-thread
parts (mounts, namespaces, cache files) so that a cancel waits for them to end.
"""

from __future__ import annotations

import asyncio
from asyncio import TaskGroup
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
Step = Coroutine[Any, Any, object]


async def all_or_none(*steps: Step) -> None:
    """Run `steps` at once. The first failure cancels the others and, once every one
    has ended (its own cleanup done), is raised as itself: a caller's error codes and
    messages stay what they are for one step, never an ExceptionGroup."""
    try:
        async with TaskGroup() as tg:
            for s in steps:
                tg.create_task(s)
    except BaseExceptionGroup as eg:
        raise _first(eg) from None


async def sparing(spared: Step, other: Step) -> None:
    """`all_or_none` of the two, except that a failure of `other` does not cut `spared`
    short: it runs to its end before the error is raised (a cancel from outside still
    cancels both). For a step whose processes must not be killed half-way because the
    other failed: a CNI plugin killed in the middle of its ADD can leave the host's
    bridge unusable for the next pod, where a finished ADD is undone by its DEL."""
    task = asyncio.ensure_future(spared)
    # Its outcome is the caller's only through all_or_none; once that has raised, a
    # later failure of `spared` is not an error left unread.
    task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def awaiting() -> None:
        await asyncio.shield(task)

    try:
        await all_or_none(awaiting(), other)
    except Exception:  # `other` failed (`spared` runs to its end) or `spared` did (it has)
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:  # cancelled while sparing it: no longer spared
            task.cancel()
            await asyncio.wait([task])
            raise
        raise
    except BaseException:  # a cancel from outside cuts both
        task.cancel()
        await asyncio.wait([task])
        raise


async def all_settled(*steps: Step) -> None:
    """Run `steps` at once and every one to its end, even past a failure (a teardown
    must not leave half of its work undone); then raise the first failure. Cancelling
    the caller cancels them all."""
    errors: list[Exception] = []

    async def settled(step: Step) -> None:
        try:
            await step
        except Exception as e:  # kept, raised once all have ended
            errors.append(e)

    async with TaskGroup() as tg:
        for s in steps:
            tg.create_task(settled(s))
    if errors:
        raise errors[0]


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """`asyncio.to_thread` for work an undo must see finished: cancelled, it still waits
    for the thread to end before raising, so no mount, file or cgroup appears after
    the undo that was to remove it has run."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


def _first(eg: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of a (nested) group: the error that ended the others."""
    e: BaseException = eg
    while isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    return e
