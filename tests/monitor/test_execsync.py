"""ExecSync through the runtime's foreground exec, in real running containers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycri.errors import FailedPrecondition, NotFound, PycriError
from pycri.monitor.execsync import (
    MAX_OUTPUT,
    ExecTimeout,
    OutputBudget,
    exec_sync,
    fit_output,
)
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


@pytest.fixture
def small_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 2 MiB tmpfs as the temp dir: an exec must not need disk for its output."""
    d = tmp_path / "small-tmp"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)], check=True)
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _busybox_times(n: int) -> bytes:
    return Path("/usr/bin/busybox").read_bytes() * n


async def test_huge_output_returns_its_first_bytes_without_disk(env: Env, small_tmp: Path) -> None:
    """80 MB of output: the first MAX_OUTPUT bytes come back, not a tail, and the
    2 MiB temp dir is enough."""
    cid, _ = await run_container(env, "sleep 100")
    r = await exec_sync(
        cid, ["/bin/sh", "-c", "i=0; while [ $i -lt 40 ]; do cat /bin/busybox; i=$((i+1)); done"],
        runtime=env.runtime, timeout=120,
    )  # fmt: skip
    assert r.exit_code == 0
    assert len(r.stdout) == MAX_OUTPUT
    assert r.stdout == _busybox_times(40)[:MAX_OUTPUT]
    assert list(small_tmp.iterdir()) == []


async def test_both_streams_full_share_the_cap_and_keep_the_exit_code(env: Env) -> None:
    cid, _ = await run_container(env, "sleep 100")
    r = await exec_sync(
        cid, ["/bin/sh", "-c",
              "i=0; while [ $i -lt 10 ]; do cat /bin/busybox; cat /bin/busybox >&2; "
              "i=$((i+1)); done; exit 7"],
        runtime=env.runtime, timeout=120,
    )  # fmt: skip
    assert r.exit_code == 7
    assert len(r.stdout) + len(r.stderr) == MAX_OUTPUT
    assert r.stdout == _busybox_times(10)[: len(r.stdout)]
    assert r.stderr == _busybox_times(10)[: len(r.stderr)]


def test_output_budget_keeps_what_fit_output_returns_and_no_more() -> None:
    """Chunks of both streams in random order: the budget's answer equals fit_output of
    everything (prefixes, filling the budget), while it never holds more than the
    budget (plus one for odd sizes)."""
    rng = random.Random(8)
    for _ in range(300):
        budget = rng.randrange(1, 64)
        full = (bytearray(), bytearray())
        kept = OutputBudget(budget)
        for _ in range(rng.randrange(0, 20)):
            i = rng.randrange(2)
            chunk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 30)))
            full[i].extend(chunk)
            kept.add(i, chunk)
            assert sum(map(len, kept.streams)) <= budget + 1
        out, err = fit_output(bytes(full[0]), bytes(full[1]), budget)
        assert kept.result() == (out, err)
        assert len(out) + len(err) == min(len(full[0]) + len(full[1]), budget)
        assert bytes(full[0]).startswith(out) and bytes(full[1]).startswith(err)


def test_fit_output_gives_unused_share_to_the_other_stream() -> None:
    assert fit_output(b"a" * 3, b"b" * 3, 10) == (b"a" * 3, b"b" * 3)
    assert fit_output(b"a" * 2, b"b" * 20, 10) == (b"a" * 2, b"b" * 8)
    assert fit_output(b"a" * 20, b"b" * 1, 10) == (b"a" * 9, b"b")
    assert fit_output(b"a" * 20, b"b" * 20, 11) == (b"a" * 5, b"b" * 6)


def _pids_with_cmdline(*needles: bytes) -> list[int]:
    """Host pids whose command line contains every needle."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            if all(n in cmd for n in needles):
                out.append(int(d))
    return out


async def _gone(*needles: bytes, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _pids_with_cmdline(*needles)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return left


@pytest.mark.parametrize("after", [0.0, 0.02, 0.1, 0.3, "running"])
async def test_cancelled_exec_kills_what_it_started(
    env: Env, after: float | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled at any point (before the runtime ran it, or while it runs), the exec
    leaves neither its process, nor its conmon, nor its files behind."""
    work = tmp_path / "exec-tmp"
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(work))
    cid, _ = await run_container(env, "sleep 100")
    task = asyncio.ensure_future(exec_sync(cid, ["sleep", "1234"], runtime=env.runtime,
                                           timeout=None))
    if after == "running":
        deadline = time.monotonic() + 20
        while not _pids_with_cmdline(b"sleep\x001234") and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert _pids_with_cmdline(b"sleep\x001234"), "the exec never started"
    else:
        await asyncio.sleep(float(after))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _gone(b"sleep\x001234") == []
    assert await _gone(b"conmon", b"--exec", cid.encode()) == []
    assert list(work.iterdir()) == []


async def test_runtime_refusing_the_exec_says_why(env: Env) -> None:
    cid, _ = await run_container(env, "sleep 100")
    with pytest.raises(PycriError) as ei:
        await exec_sync(cid, ["/nonexistent"], runtime=env.runtime, timeout=10)
    assert "/nonexistent" in str(ei.value) and "no such file" in str(ei.value).lower()
    assert "\n" not in str(ei.value)


async def test_background_writer_does_not_hold_the_call(env: Env) -> None:
    """A child left writing forever: the call ends with its parent, and the child dies
    of SIGPIPE once the pipe is closed."""
    cid, _ = await run_container(env, "sleep 100")
    r = await exec_sync(
        cid, ["/bin/sh", "-c", "(while :; do echo yyyyyyyy; done) & echo started"],
        runtime=env.runtime, timeout=30,
    )  # fmt: skip
    assert r.exit_code == 0
    assert b"started\n" in r.stdout
    assert len(r.stdout) <= MAX_OUTPUT
    assert await _gone(b"do echo yyyyyyyy; done") == []
