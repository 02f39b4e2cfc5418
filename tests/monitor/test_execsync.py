"""ExecSync through the runtime's foreground exec, in real running containers."""

from __future__ import annotations

import asyncio
import time

import pytest

from pycri.errors import FailedPrecondition, NotFound
from pycri.monitor.execsync import ExecTimeout, exec_sync
from tests.monitor.ocibundle import Env
from tests.monitor.test_conmon import Exits, run_container


async def test_exec_output_exit_code_and_env(env: Env) -> None:
    cid, _ = await run_container(env, "sleep 100")
    r = await exec_sync(
        cid, ["/bin/sh", "-c", "echo $GREETING; echo oops >&2; exit 5"],
        runtime=env.runtime, timeout=10,
    )  # fmt: skip
    assert (r.exit_code, r.stdout, r.stderr) == (5, b"hello\n", b"oops\n")


async def test_exec_background_child_does_not_hang(env: Env) -> None:
    cid, _ = await run_container(env, "sleep 100")
    t0 = time.monotonic()
    r = await exec_sync(
        cid, ["/bin/sh", "-c", "sleep 100 & echo hi"], runtime=env.runtime, timeout=30
    )
    assert time.monotonic() - t0 < 3
    assert r.exit_code == 0 and r.stdout == b"hi\n"


async def test_exec_timeout_kills(env: Env) -> None:
    cid, _ = await run_container(env, "sleep 100")
    t0 = time.monotonic()
    with pytest.raises(ExecTimeout) as ei:
        await exec_sync(
            cid, ["/bin/sh", "-c", "sleep 100 & echo started; sleep 100"],
            runtime=env.runtime, timeout=1,
        )  # fmt: skip
    assert time.monotonic() - t0 < 3
    assert ei.value.stdout == b"started\n"


async def test_exec_output_is_capped(env: Env) -> None:
    cid, _ = await run_container(env, "sleep 100")
    r = await exec_sync(
        cid, ["/bin/sh", "-c", "i=0; while [ $i -lt 2000 ]; do echo 0123456789; i=$((i+1)); done"],
        runtime=env.runtime, timeout=30, max_output=1000,
    )  # fmt: skip
    assert r.exit_code == 0 and len(r.stdout) == 1000


async def test_exec_in_stopped_or_unknown_container(env: Env) -> None:
    ex = Exits(env)
    try:
        cid, _ = await run_container(env, "exit 0")
        await ex.wait(cid)
    finally:
        ex.watcher.close()
    with pytest.raises(FailedPrecondition):
        await exec_sync(cid, ["/bin/true"], runtime=env.runtime, timeout=5)
    with pytest.raises(NotFound):
        await exec_sync("nope", ["/bin/true"], runtime=env.runtime, timeout=5)
    await asyncio.sleep(0)
