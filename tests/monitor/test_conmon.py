"""conmon driver against real conmon + runc/crun: create/start, logs, exits, ctl, errors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pycri.errors import PycriError
from pycri.monitor import conmon
from pycri.monitor.exits import ExitWatcher
from tests.monitor.ocibundle import Env, pid_alive

LOG_LINE = re.compile(rb"^(\S+) (stdout|stderr) ([PF]) (.*)$")
REPO = Path(__file__).resolve().parents[2]


class Exits:
    """ExitWatcher feeding one future per container id."""

    def __init__(self, env: Env) -> None:
        self.futures: dict[str, asyncio.Future[tuple[int, int]]] = {}
        self.watcher = ExitWatcher(env.exit_dir, self._on_exit)
        self.watcher.start()

    def _on_exit(self, cid: str, code: int, at: int) -> None:
        fut = self.futures.setdefault(cid, asyncio.get_running_loop().create_future())
        if not fut.done():
            fut.set_result((code, at))

    async def wait(self, cid: str, timeout: float = 10.0) -> tuple[int, int]:
        fut = self.futures.setdefault(cid, asyncio.get_running_loop().create_future())
        return await asyncio.wait_for(fut, timeout)


@pytest.fixture
async def exits(env: Env):  # type: ignore[no-untyped-def]
    ex = Exits(env)
    yield ex
    ex.watcher.close()


async def run_container(env: Env, script: str) -> tuple[str, conmon.Created]:
    cid = env.new_id()
    bundle = env.bundle(cid, ["/bin/sh", "-c", script])
    created = await conmon.create(
        cid,
        bundle,
        runtime=env.runtime,
        log_path=env.log(cid),
        exit_dir=env.exit_dir,
        persist_dir=env.persist(cid),
    )
    env.conmons[cid] = created.conmon_pid
    await env.runtime.start(cid)
    return cid, created


def log_entries(path: Path) -> list[tuple[bytes, bytes, bytes]]:
    out = []
    for line in path.read_bytes().splitlines():
        m = LOG_LINE.match(line)
        assert m, f"not a CRI log line: {line!r}"
        ts = m.group(1).decode()
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+([+-]\d\d:\d\d|Z)$", ts), ts
        out.append((m.group(2), m.group(3), m.group(4)))
    return out


async def test_create_start_logs_and_exit_code(env: Env, exits: Exits) -> None:
    cid, created = await run_container(
        env, "echo out1; echo err1 >&2; printf part; sleep 0.3; echo rest; printf tail; exit 3"
    )
    assert created.pid > 0 and created.conmon_pid > 0
    code, at = await exits.wait(cid)
    assert code == 3
    assert at > 0
    assert (env.exit_dir / cid).read_text() == "3"
    assert (env.persist(cid) / "exit").read_text() == "3"
    entries = log_entries(env.log(cid))
    assert (b"stdout", b"F", b"out1") in entries
    assert (b"stderr", b"F", b"err1") in entries
    assert (b"stdout", b"P", b"part") in entries
    assert (b"stdout", b"F", b"rest") in entries
    assert (b"stdout", b"P", b"tail") in entries
    assert not conmon.oom_killed(env.persist(cid))
    st = await env.runtime.state(cid)
    assert st is not None and st["status"] == "stopped"


async def test_exit_zero_and_sigkill(env: Env, exits: Exits) -> None:
    ok, _ = await run_container(env, "exit 0")
    assert (await exits.wait(ok))[0] == 0
    victim, _ = await run_container(env, "sleep 100")
    await env.runtime.kill(victim, signal.SIGKILL)
    assert (await exits.wait(victim))[0] == 137


async def test_sigterm_stops_container(env: Env, exits: Exits) -> None:
    # sh as pid 1 ignores SIGTERM unless it traps it.
    cid, _ = await run_container(
        env, "trap 'exit 143' TERM; echo trapped; while true; do sleep 0.1; done")
    deadline = asyncio.get_running_loop().time() + 10
    while b"trapped" not in env.log(cid).read_bytes():  # the trap is installed
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)
    await env.runtime.kill(cid, signal.SIGTERM)
    assert (await exits.wait(cid))[0] == 143
    await env.runtime.kill(cid, signal.SIGTERM)  # already stopped: no error


async def test_reopen_log(env: Env, exits: Exits) -> None:
    go = f"go-{os.getpid()}-{id(env)}"
    cid, _ = await run_container(
        env, f"echo before; while [ ! -e /{go} ]; do sleep 0.05; done; echo after"
    )
    log = env.log(cid)
    deadline = asyncio.get_running_loop().time() + 5
    while b"before" not in log.read_bytes():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)
    rotated = log.with_suffix(".1")
    log.rename(rotated)
    await conmon.reopen_log(env.tmp / "bundles" / cid, log)
    assert log.exists() and log.read_bytes() == b""
    (env.rootfs / go).touch()
    try:
        assert (await exits.wait(cid))[0] == 0
    finally:
        (env.rootfs / go).unlink()
    assert [e[2] for e in log_entries(log)] == [b"after"]
    assert [e[2] for e in log_entries(rotated)] == [b"before"]


async def test_ctl_after_conmon_gone_is_failed_precondition(env: Env, exits: Exits) -> None:
    cid, _ = await run_container(env, "exit 0")
    await exits.wait(cid)
    assert await conmon.wait_gone(env.conmons[cid], 5)
    from pycri.errors import FailedPrecondition

    with pytest.raises(FailedPrecondition):
        conmon.resize(env.tmp / "bundles" / cid, 80, 24)


async def test_bad_spec_leaves_nothing(env: Env) -> None:
    cid = env.new_id()
    bundle = env.bundle(cid, ["/bin/does-not-exist"])
    before_bundle = sorted(p.name for p in bundle.iterdir())
    with pytest.raises(PycriError) as ei:
        await conmon.create(
            cid,
            bundle,
            runtime=env.runtime,
            log_path=env.log(cid),
            exit_dir=env.exit_dir,
            persist_dir=env.persist(cid),
        )
    msg = str(ei.value)
    assert "does-not-exist" in msg or "no such file" in msg.lower(), msg
    assert "\n" not in msg
    assert sorted(p.name for p in bundle.iterdir()) == before_bundle
    assert not env.persist(cid).exists()
    assert not env.log(cid).exists()
    assert list(env.exit_dir.iterdir()) == []
    assert await env.runtime.state(cid) is None
    assert _conmon_pids(cid) == set()


def _conmon_pids(cid: str) -> set[int]:
    """Live conmons of `cid` (other tests on the host run conmons of their own)."""
    pids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "conmon" and pid_alive(int(d.name)) and (
                    cid.encode() in (d / "cmdline").read_bytes().split(b"\0")
                ):
                    pids.add(int(d.name))
            except OSError:
                pass
    return pids


async def test_conmon_survives_its_starter(env: Env) -> None:
    cid = env.new_id()
    bundle = env.bundle(cid, ["/bin/sh", "-c", "sleep 100"])
    args = {
        "cid": cid, "bundle": str(bundle), "runtime": env.runtime_name,
        "root": str(env.runtime.root), "log": str(env.log(cid)),
        "exit_dir": str(env.exit_dir), "persist": str(env.persist(cid)),
    }  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "tests.monitor.starter", json.dumps(args)],
        cwd=REPO, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    result = json.loads(proc.stdout)
    env.conmons[cid] = result["conmon_pid"]
    assert pid_alive(result["conmon_pid"])
    st = await env.runtime.state(cid)
    assert st is not None and st["status"] == "running"
    assert pid_alive(result["pid"])
    # conmon still monitors: a kill now produces the exit file.
    ex = Exits(env)
    try:
        await env.runtime.kill(cid, signal.SIGKILL)
        assert (await ex.wait(cid))[0] == 137
    finally:
        ex.watcher.close()


async def test_scan_finds_exit_while_daemon_down(env: Env) -> None:
    cid, created = await run_container(env, "exit 7")
    assert await conmon.wait_gone(created.conmon_pid, 10)
    seen: list[tuple[str, int]] = []
    watcher = ExitWatcher(env.exit_dir, lambda c, code, at: seen.append((c, code)))
    watcher.start()
    try:
        assert watcher.scan() == [cid]
    finally:
        watcher.close()
    assert seen == [(cid, 7)]


async def test_subreaper_leaves_no_zombie(env: Env) -> None:
    cid = env.new_id()
    bundle = env.bundle(cid, ["/bin/sh", "-c", "sleep 100"])
    args = {
        "cid": cid, "bundle": str(bundle), "runtime": env.runtime_name,
        "root": str(env.runtime.root), "log": str(env.log(cid)),
        "exit_dir": str(env.exit_dir), "persist": str(env.persist(cid)), "reaper": True,
    }  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "tests.monitor.starter", json.dumps(args)],
        cwd=REPO, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    result = json.loads(proc.stdout)
    assert result["conmon_parent_was_us"] is True
    assert result["reaped"] == [result["conmon_pid"]]
    assert result["zombies"] == []
    assert result["exit_code"] == 137
    assert os.path.exists(env.exit_dir / cid)


async def test_undo_kills_no_process_once_the_monitor_was_reaped() -> None:
    """A failed create kills its conmon through the reaper's watch on it: once that has
    resolved, conmon is reaped and its pid may name another process, left alone."""
    other = subprocess.Popen(["sleep", "60"])  # whoever has the reaped conmon's pid now
    try:
        reaped: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        reaped.set_result(0)
        await conmon.kill_monitor(other.pid, reaped, timeout=1.0)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
