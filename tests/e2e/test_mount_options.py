"""Bind-mount options (CRI `Mount.mount_options`) end to end, under runc and crun: the
flags are on the container's mount, they are enforced, and under a recursively read-only
mount on every submount too; an option that is not a bind flag creates nothing."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e

HANDLERS = ["runc", "crun"]
SLEEP = ["sleep", "1000"]
FLAGS = ["noexec", "nosuid", "nodev"]


def run_pod(node: Node, name: str, handler: str) -> tuple[str, pb.PodSandboxConfig]:
    cfg = node.pod_config(name)
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=cfg, runtime_handler=handler)).pod_sandbox_id
    return sid, cfg


def mount_flags(node: Node, cid: str, path: str) -> set[str]:
    """The per-mount options of `path` in the container's own /proc/self/mountinfo."""
    r = node.exec(cid, "cat", "/proc/self/mountinfo")
    assert r.exit_code == 0, r.stderr
    found = [line.split() for line in r.stdout.decode().splitlines()
             if line.split()[4] == path]
    assert found, f"{path} is not a mount point in the container"
    return set(found[-1][5].split(","))


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A volume holding a script, with a tmpfs submount holding another."""
    d = tmp_path / "vol"
    (d / "sub").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "optstest", str(d / "sub")], check=True)
    try:
        for script in (d / "run.sh", d / "sub" / "run.sh"):
            script.write_text("#!/bin/sh\necho ran\n")
            script.chmod(0o755)
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d / "sub")], check=False)


def assert_cannot_exec(node: Node, cid: str, path: str) -> None:
    r = node.exec(cid, "sh", "-c", f"{path}; echo rc=$?")
    assert b"ran" not in r.stdout and b"Permission denied" in r.stderr, (r.stdout, r.stderr)


@pytest.mark.parametrize("handler", HANDLERS)
def test_noexec_nosuid_nodev_volume(node: Node, volume: Path, handler: str) -> None:
    features = node.cri.runtime.Status(pb.StatusRequest()).features
    assert features.mount_options
    sid, pod = run_pod(node, f"opts-{handler}", handler)
    plain = node.run(sid, pod, "plain", SLEEP, mounts=[
        pb.Mount(container_path="/vol", host_path=str(volume))])
    assert not mount_flags(node, plain, "/vol") & set(FLAGS)  # none of them by default
    assert node.exec(plain, "/vol/run.sh").stdout == b"ran\n"
    cid = node.run(sid, pod, "opts", SLEEP, mounts=[
        pb.Mount(container_path="/vol", host_path=str(volume), mount_options=FLAGS)])
    assert mount_flags(node, cid, "/vol") >= {"rw", *FLAGS}
    assert_cannot_exec(node, cid, "/vol/run.sh")
    assert node.exec(cid, "cat", "/vol/run.sh").exit_code == 0  # still readable
    assert node.exec(cid, "touch", "/vol/written").exit_code == 0  # and writable
    # Under a plain rbind only the volume's own mount is remounted: a submount keeps
    # its flags, as with every runtime.
    assert "noexec" not in mount_flags(node, cid, "/vol/sub")


@pytest.mark.parametrize("handler", HANDLERS)
def test_options_with_recursive_read_only(node: Node, volume: Path, handler: str) -> None:
    sid, pod = run_pod(node, f"rro-{handler}", handler)
    cid = node.run(sid, pod, "rro", SLEEP, mounts=[
        pb.Mount(container_path="/vol", host_path=str(volume), readonly=True,
                 recursive_read_only=True, mount_options=["rw", *FLAGS])])
    for path in ("/vol", "/vol/sub"):  # the staged copy carries them to every submount
        assert mount_flags(node, cid, path) >= {"ro", *FLAGS}, path
        assert_cannot_exec(node, cid, f"{path}/run.sh")
    r = node.exec(cid, "touch", "/vol/sub/x")
    assert r.exit_code != 0 and b"Read-only file system" in r.stderr  # rw did not win


@pytest.mark.parametrize("handler", HANDLERS)
def test_bad_option_creates_nothing(node: Node, volume: Path, handler: str) -> None:
    sid, pod = run_pod(node, f"bad-{handler}", handler)
    bundles = node.tmp / "state" / "bundles"
    before = sorted(p.name for p in bundles.iterdir())
    with pytest.raises(grpc.RpcError) as e:
        node.create(sid, pod, "bad", SLEEP, mounts=[pb.Mount(
            container_path="/vol", host_path=str(volume), mount_options=["noexec", "size=1m"])])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "mount_options[1]: 'size=1m' is not a bind-mount option" in (e.value.details() or "")
    assert not node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers
    assert sorted(p.name for p in bundles.iterdir()) == before  # the infra's only
    assert not list((node.tmp / "root" / "snapshots").glob("*"))
    # The name was never taken: the same container with good options is created.
    node.create(sid, pod, "bad", SLEEP, mounts=[pb.Mount(
        container_path="/vol", host_path=str(volume), mount_options=["noexec"])])
