"""Host files the daemon touches for a container: seccomp profiles and recursive read-only
staging (issue 8, defects 8 and 1), against a real node with runc under conmon."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

# A runtime that probes the staging area on `create`, as uid 65534 would see it from a
# state dir it can traverse (production's /run/pycri is 0711; pytest's tmp dirs are
# 0700, so the probe starts from an O_PATH fd of the state dir). While <ctl>/hold exists
# it then waits, which gives a test a window inside CreateContainer.
PROBE = """#!{python}
import glob, json, os, sys, time
state, ctl = {state!r}, {ctl!r}
if "create" in sys.argv:
    staged = sorted(p[len(state) + 1:] for p in glob.glob(state + "/rro/*/*/secret"))
    codes = []
    for rel in staged:
        sfd = os.open(state, os.O_PATH)
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([]); os.setgid(65534); os.setuid(65534)
                os._exit(0 if os.read(os.open(rel, os.O_RDONLY, dir_fd=sfd), 64) else 3)
            except PermissionError:
                os._exit(13)
            except BaseException:
                os._exit(4)
        codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    with open(ctl + "/probe.tmp", "w") as f:
        json.dump({{"staged": staged, "as_nobody": codes, "pid": os.getpid()}}, f)
    os.rename(ctl + "/probe.tmp", ctl + "/probe.json")
    while os.path.exists(ctl + "/hold"):
        time.sleep(0.05)
os.execv("/usr/sbin/runc", ["/usr/sbin/runc"] + sys.argv[1:])
"""


@pytest.fixture
def probe(node: Node) -> Path:
    """Add the `probe` runtime handler to the node (config + restart); returns its ctl dir."""
    ctl = node.tmp / "probe-ctl"
    ctl.mkdir()
    node.add_runtime("probe", PROBE.format(python=sys.executable, state=str(node.proc.state),
                                           ctl=str(ctl)))
    return ctl


def _secret_volume(tmp: Path) -> Path:
    """A volume whose only protection is its 0750 parent, as a secret's would be."""
    parent = tmp / "protected"
    parent.mkdir(mode=0o750)
    os.chmod(parent, 0o750)
    vol = parent / "vol"
    vol.mkdir(mode=0o755)
    (vol / "secret").write_text("TOPSECRET\n")
    os.chmod(vol / "secret", 0o644)
    return vol


def _rro_config(node: Node, vol: Path) -> pb.ContainerConfig:
    cfg = node.container_config("rro", ["sleep", "30"])
    cfg.mounts.append(pb.Mount(container_path="/secret", host_path=str(vol), readonly=True,
                               recursive_read_only=True))
    return cfg


def _probe_pod(node: Node, ctl: Path) -> tuple[str, pb.PodSandboxConfig]:
    """A pod on the probe runtime; the probe of its infra's create is thrown away."""
    cfg = node.pod_config("probe")
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=cfg, runtime_handler="probe")).pod_sandbox_id
    (ctl / "probe.json").unlink()
    return sid, cfg


def _staged_mounts(state: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(f"{state}/rro/")]


def test_staged_rro_copy_is_not_reachable_by_other_users(node: Node, probe: Path) -> None:
    """Issue 8 defect 1: uid 65534 read a 0750-protected volume through <state>/rro."""
    sid, pod = _probe_pod(node, probe)
    cfg = _rro_config(node, _secret_volume(node.tmp))
    node.cri.runtime.CreateContainer(
        pb.CreateContainerRequest(pod_sandbox_id=sid, config=cfg, sandbox_config=pod))
    result = json.loads((probe / "probe.json").read_text())
    assert len(result["staged"]) == 1, result  # the copy was there while runc ran
    assert result["as_nobody"] == [13], result  # EACCES: not reachable by uid 65534
    rro = node.proc.state / "rro"
    assert stat.S_IMODE(rro.stat().st_mode) == 0o700
    assert not list(rro.iterdir()) and _staged_mounts(node.proc.state) == []


def test_stale_rro_staging_is_removed_at_start(node: Node, probe: Path) -> None:
    """kill -9 inside CreateContainer, while the copy is mounted: the restart removes it."""
    sid, pod = _probe_pod(node, probe)
    (probe / "hold").touch()
    cfg = _rro_config(node, _secret_volume(node.tmp))
    errors: list[grpc.RpcError] = []

    def create() -> None:
        try:
            node.cri.runtime.CreateContainer(
                pb.CreateContainerRequest(pod_sandbox_id=sid, config=cfg, sandbox_config=pod),
                timeout=120)
        except grpc.RpcError as e:
            errors.append(e)

    t = threading.Thread(target=create)
    t.start()
    deadline = time.monotonic() + 60
    while not (probe / "probe.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    result = json.loads((probe / "probe.json").read_text())
    assert len(result["staged"]) == 1, result
    node.proc.kill()
    t.join(60)
    node.cri.channel.close()
    assert errors and errors[0].code() == grpc.StatusCode.UNAVAILABLE
    assert len(_staged_mounts(node.proc.state)) == 1  # left behind by the crash
    (probe / "hold").unlink()  # let the runtime finish; pycri is gone, it owns nothing now
    deadline = time.monotonic() + 60
    while Path(f"/proc/{result['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    node.start()
    assert _staged_mounts(node.proc.state) == []
    assert not list((node.proc.state / "rro").iterdir())
    assert not node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers


def test_orphan_staging_without_a_record_is_removed_at_start(node: Node, tmp_path: Path) -> None:
    """A staged copy no record knows about (any crash, any older pycri) goes at start too,
    by umount and rmdir only: the host files under it are untouched."""
    vol = _secret_volume(tmp_path)
    target = node.proc.state / "rro" / "0123abcd" / "0"
    node.cri.channel.close()
    assert node.proc.stop() == 0
    target.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(vol), str(target)], check=True)
    try:
        node.start()
        assert _staged_mounts(node.proc.state) == []
        assert not list((node.proc.state / "rro").iterdir())
        assert (vol / "secret").read_text() == "TOPSECRET\n"
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def test_fifo_seccomp_profile_is_refused_and_daemon_stays_responsive(node: Node,
                                                                      tmp_path: Path) -> None:
    """Issue 8 defect 8: a FIFO Localhost profile blocked the event loop (Version timed out)."""
    fifo = tmp_path / "profile.json"
    os.mkfifo(fifo)
    sid, pod = node.run_pod("fifo")
    cfg = node.container_config("fifo", ["sleep", "30"])
    cfg.linux.security_context.seccomp.CopyFrom(pb.SecurityProfile(
        profile_type=pb.SecurityProfile.Localhost, localhost_ref=str(fifo)))
    outcome: list[grpc.RpcError | str] = []

    def create() -> None:
        try:
            outcome.append(node.cri.runtime.CreateContainer(
                pb.CreateContainerRequest(pod_sandbox_id=sid, config=cfg, sandbox_config=pod),
                timeout=60).container_id)
        except grpc.RpcError as e:
            outcome.append(e)

    t = threading.Thread(target=create)
    t.start()
    try:
        version = node.cri.runtime.Version(pb.VersionRequest(), timeout=10)
        assert version.runtime_name
        t.join(30)
    finally:  # release a reader blocked on the FIFO (before the fix), so the RPC ends
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(60)
    assert outcome and isinstance(outcome[0], grpc.RpcError), outcome
    assert outcome[0].code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"seccomp profile {fifo}: is a FIFO, not a regular file" in (outcome[0].details() or "")
    assert not node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers
