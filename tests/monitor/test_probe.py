"""The facts the recheck reads after a restart: a process named by pid and start time,
and what conmon's files say, with real processes and a real launcher state dir."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from pycri.config import Config
from pycri.launcher import Launcher
from pycri.monitor.probe import Fact, identity_of, is_alive, is_same, start_time
from pycri.monitor.reaper import Reaper
from pycri.store import Store
from pycri.store.container import Container
from pycri.store.identity import Identity
from pycri.store.sandbox import Sandbox


def test_start_time_is_field_22_of_stat() -> None:
    stat = Path("/proc/self/stat").read_text()
    assert start_time(os.getpid()) == int(stat.rsplit(")", 1)[1].split()[19])
    assert start_time(2**22 + 1) is None  # above any pid_max


def test_a_process_is_alive_only_while_it_runs_and_is_itself() -> None:
    proc = subprocess.Popen(["sleep", "100"])
    ident = identity_of(proc.pid)
    assert ident is not None and is_alive(ident)
    # The same pid with another start time: a process that reused the pid.
    assert not is_alive(Identity(proc.pid, ident.start + 1))
    assert not is_same(Identity(proc.pid, ident.start + 1))
    proc.kill()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # a zombie, not reaped yet
    assert not is_alive(ident) and is_same(ident)
    proc.wait()
    assert not is_alive(ident) and not is_same(ident)


@pytest.fixture
def launcher(tmp_path: Path) -> Launcher:
    return Launcher(Config(root=str(tmp_path / "root"), state=str(tmp_path / "state")),
                    Reaper())


def test_probe_reads_exit_file_bundle_and_process(launcher: Launcher) -> None:
    launcher.exit_dir.mkdir(parents=True)
    assert launcher.probe("nobundle", None).fact is Fact.LOST  # gone with a reboot
    launcher.persist_dir("c").mkdir(parents=True)
    assert launcher.probe("c", None).fact is Fact.UNKNOWN  # no start time recorded
    proc = subprocess.Popen(["sleep", "100"])
    try:
        ident = identity_of(proc.pid)
        assert ident is not None
        assert launcher.probe("c", ident).fact is Fact.RUNS
        assert launcher.probe("c", Identity(proc.pid, ident.start + 1)).fact is Fact.GONE
    finally:
        proc.kill()
        proc.wait()
    assert launcher.probe("c", ident).fact is Fact.GONE
    launcher.exit_file("c").write_text("7")
    p = launcher.probe("c", ident)
    assert (p.fact, p.exit_code) == (Fact.EXITED, 7)
    assert p.finished_at == launcher.exit_file("c").stat().st_mtime_ns


def test_records_of_older_pycris_load_without_start_times(tmp_path: Path) -> None:
    """The start times are new fields of the JSON records: an older pycri's database
    loads as it is, with nothing recorded (the recheck asks the runtime, once)."""
    c = Container(id="c1", sandbox_id="s1", config=pb.ContainerConfig(), image_id="i",
                  image_ref="i", handler="runc", created_at=1, log_path="", pid=42)
    old_c = c.to_record()
    del old_c["pid_start"]
    sb = Sandbox(id="s1", config=pb.PodSandboxConfig(), handler="runc", runtime_handler="",
                 created_at=1, infra_pid=43)
    old_sb = sb.to_record()
    del old_sb["infra_start"]
    db = Store(tmp_path / "m.db")
    db.put("container", "c1", old_c)
    db.put("sandbox", "s1", old_sb)
    db.close()
    db = Store(tmp_path / "m.db")
    [c2] = db.load("container", Container.from_record)
    [sb2] = db.load("sandbox", Sandbox.from_record)
    assert (c2.pid, c2.pid_start, c2.init) == (42, 0, None)
    assert (sb2.infra_pid, sb2.infra_start, sb2.infra) == (43, 0, None)
    assert c2.to_record()["pid_start"] == 0 and sb2.to_record()["infra_start"] == 0
