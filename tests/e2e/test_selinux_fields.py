"""SELinux fields on a host without SELinux (this one): a kubelet's pod and container
that carry them run, nothing SELinux reaches the runtime, and each field present is
noted once per request in the daemon's debug log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from pycri.oci import selinux
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e

LEVEL = pb.SELinuxOption(level="s0:c1,c2")


def spec_of(node: Node, oid: str) -> dict[str, object]:
    path = node.tmp / "state" / "bundles" / oid / "config.json"
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@pytest.mark.skipif(selinux.enabled(), reason="this host has SELinux")
def test_selinux_fields_accepted_and_ignored(node: Node, tmp_path: Path) -> None:
    sid, cfg = node.run_pod("labelled", linux=pb.LinuxPodSandboxConfig(
        security_context=pb.LinuxSandboxSecurityContext(selinux_options=LEVEL)))
    vol = tmp_path / "vol"
    vol.mkdir()
    cid = node.run(sid, cfg, "app", ["sleep", "1000"],
                   mounts=[pb.Mount(container_path="/data", host_path=str(vol),
                                    selinux_relabel=True)],
                   linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
                       selinux_options=LEVEL)))
    assert node.status(cid).state == pb.CONTAINER_RUNNING
    for oid in (sid, cid):
        spec = spec_of(node, oid)
        assert "selinuxLabel" not in json.dumps(spec) and "mountLabel" not in json.dumps(spec)
    data = next(m for m in spec_of(node, cid)["mounts"]  # type: ignore[attr-defined]
                if m["destination"] == "/data")
    assert "z" not in data["options"]
    log = node.proc.log_text()
    ignored = "ignored: SELinux is not enabled on this host"
    assert log.count(f"pod sandbox {sid}: linux.security_context.selinux_options {ignored}") == 1
    assert log.count(f"container {cid}: linux.security_context.selinux_options {ignored}") == 1
    assert log.count(f"container {cid}: mounts[0].selinux_relabel {ignored}") == 1
