"""The build before issue 24's restructuring (878fb33, the last landing before it) writes
records this one reads: a node it ran restarts into this build with its pod and
container running and loses nothing, and goes back (issue 24, item 6).

The previous build runs from its own sources (`git archive`) on this venv's
dependencies, which it shares: `python -S` keeps the venv's editable install of this
build out of its path."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from tests.conftest import NO_DEFAULT_CADVISOR, REPO
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e

PREVIOUS = "878fb33"


# Runs the daemon's `python -m pycri ...` as `python -S -m pycri ...` from `/`, so neither
# the venv's editable install nor a checkout in the working directory is on its path.
NO_SITE = ("sh", "-c", 'cd / && exec "$0" -S "$@"')


def previous_build(tmp: Path) -> dict[str, str]:
    """The environment that runs the previous build's `python -S -m pycri`."""
    tree = tmp / "previous"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS, "pycri"],
                             capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"not exercised: upgrade from {PREVIOUS} (no git history: "
                    f"{archive.stderr.decode().strip()[:200]})")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *sorted(deps)])}
    where = subprocess.run([sys.executable, "-S", "-c", "import pycri; print(pycri.__file__)"],
                           env=env, cwd="/", capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(tree)), where
    return env


def previous_config(node: Node) -> Path:
    """The node's config as the previous build reads it: without the tables it does not
    know ([cadvisor], issue 44), which it would refuse."""
    path = node.tmp / "previous.toml"
    text = node.proc.config.read_text()
    assert NO_DEFAULT_CADVISOR in text
    path.write_text(text.replace(NO_DEFAULT_CADVISOR, ""))
    return path


def test_a_node_of_the_previous_build_restarts_into_this_one_and_back(node: Node) -> None:
    env = previous_build(node.tmp)
    configs = {None: node.proc.config, "previous": previous_config(node)}
    node.cri.channel.close()
    assert node.proc.stop() == 0
    node.proc.env, node.proc.launcher = env, NO_SITE
    node.proc.config = configs["previous"]
    node.start()
    sid, pod = node.run_pod("upgrade")
    cid = node.run(sid, pod, "c", ["sh", "-c", "echo up > /tmp/mark; sleep 600"])
    node.wait_for_file(cid, "/tmp/mark")
    before = node.status(cid)
    ip = node.pod_status(sid).network.ip

    for build in (None, env, None):  # this build, back to the previous one, this one
        node.cri.channel.close()
        assert node.proc.stop() == 0
        node.proc.env, node.proc.launcher = build, NO_SITE if build else ()
        node.proc.config = configs["previous" if build else None]
        node.start()
        status = node.status(cid)
        assert (status.state, status.started_at, status.created_at) == (
            pb.CONTAINER_RUNNING, before.started_at, before.created_at)
        assert node.pod_status(sid).state == pb.SANDBOX_READY
        assert node.pod_status(sid).network.ip == ip
        assert node.exec(cid, "cat", "/tmp/mark").stdout == b"up\n"
        listed = node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers
        assert [c.id for c in listed] == [cid]

    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
