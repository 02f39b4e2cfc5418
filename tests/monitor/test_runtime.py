"""OCIRuntime against real runc and crun: state/start/kill/delete/update and errors."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from pycri.errors import FailedPrecondition, InvalidArgument, NotFound
from pycri.monitor import conmon
from pycri.oci.runtime import OCIRuntime, OCIRuntimeError, one_line, runtime_failure
from tests.monitor.ocibundle import Env

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")




async def test_unknown_container(env: Env) -> None:
    rt = env.runtime
    assert await rt.state("nope") is None
    await rt.kill("nope", signal.SIGKILL)
    await rt.delete("nope")
    await rt.delete("nope", force=True)
    with pytest.raises(NotFound):
        await rt.start("nope")
    with pytest.raises(NotFound):
        await rt.update("nope", {"pids": {"limit": 10}})
    with pytest.raises(InvalidArgument):
        await rt.state("../etc")


async def test_lifecycle_and_update(env: Env) -> None:
    cid = env.new_id()
    created = await conmon.create(
        cid, env.bundle(cid, ["/bin/sh", "-c", "sleep 100"]), runtime=env.runtime,
        log_path=env.log(cid), exit_dir=env.exit_dir, persist_dir=env.persist(cid),
    )  # fmt: skip
    env.conmons[cid] = created.conmon_pid
    st = await env.runtime.state(cid)
    assert st is not None and st["status"] == "created" and st["pid"] == created.pid
    await env.runtime.start(cid)
    st = await env.runtime.state(cid)
    assert st is not None and st["status"] == "running"
    await env.runtime.update(cid, {"pids": {"limit": 42}})
    limit = Path(f"/sys/fs/cgroup/pids/{env.cgroup_parent}/{cid}/pids.max").read_text()
    assert limit.strip() == "42"
    with pytest.raises(OCIRuntimeError) as ei:
        await env.runtime.start(cid)  # already running
    assert "\n" not in str(ei.value) and env.runtime_name in str(ei.value)
    await env.runtime.kill(cid, signal.SIGKILL, all_processes=True)
    assert await conmon.wait_gone(created.conmon_pid, 10)
    await env.runtime.kill(cid, signal.SIGKILL)  # stopped: no error
    await env.runtime.delete(cid)
    assert await env.runtime.state(cid) is None


async def test_update_of_a_stopped_container_is_failed_precondition(env: Env) -> None:
    """Found by the fuzzer: UpdateContainerResources just after the process exited (before
    its exit file was read) came back UNKNOWN with runc's "container not running"."""
    cid = env.new_id()
    created = await conmon.create(
        cid, env.bundle(cid, ["/bin/sh", "-c", "exit 0"]), runtime=env.runtime,
        log_path=env.log(cid), exit_dir=env.exit_dir, persist_dir=env.persist(cid),
    )  # fmt: skip
    env.conmons[cid] = created.conmon_pid
    await env.runtime.start(cid)
    assert await conmon.wait_gone(created.conmon_pid, 10)
    try:  # crun accepts it; runc refuses, and that must not be an unknown failure
        await env.runtime.update(cid, {"pids": {"limit": 42}})
    except FailedPrecondition as e:
        assert "not running" in str(e)
    await env.runtime.delete(cid)


def test_one_line_messages() -> None:
    logrus = b'time="2024-01-01T00:00:00Z" level=error msg="container \\"x\\" does not exist"\n'
    assert one_line(logrus) == 'container "x" does not exist'
    assert one_line(b'{"level":"error","msg":"boom"}\nboom\n') == "boom"
    assert one_line(b"line one\nline two\n") == "line one; line two"


def test_crun_hybrid_refusal_is_failed_precondition() -> None:
    err = runtime_failure(
        "crun", "create", "c1", "cgroups in hybrid mode not supported, drop all controllers "
        "from cgroupv2\n",
    )  # fmt: skip
    assert isinstance(err, FailedPrecondition)
    assert "hugetlb" in str(err) and "\n" not in str(err)


async def test_runtime_binary_hang_is_bounded(tmp_path: Path) -> None:
    slow = tmp_path / "slow-runtime"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    rt = OCIRuntime("slow", str(slow), tmp_path / "root", timeout=0.5)
    from pycri.errors import DeadlineExceeded

    with pytest.raises(DeadlineExceeded):
        await rt.state("x")
