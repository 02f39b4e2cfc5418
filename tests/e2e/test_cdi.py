"""CDI devices end to end: a spec file in the node's [cdi] spec_dirs adds a device node
(an alias of /dev/null), env and a mount to a real container, asked for by
ContainerConfig.CDI_devices or by a cdi.k8s.io/ annotation; an unknown device or a
malformed spec is refused with nothing created; an edited spec takes effect."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e

SLEEP = ["sleep", "1000"]
NULL = os.stat("/dev/null")


def spec(data: Path, env: str = "CDI_TEST=yes") -> dict[str, Any]:
    return {
        "cdiVersion": "0.6.0",
        "kind": "pycri.test/null",
        "containerEdits": {"env": ["CDI_SPEC=1"]},
        "devices": [{"name": "null", "containerEdits": {
            "deviceNodes": [{"path": "/dev/cdi-null", "hostPath": "/dev/null"}],
            "env": [env],
            "mounts": [{"hostPath": str(data), "containerPath": "/cdi-data",
                        "options": ["rbind", "ro"]}],
        }}],
    }


@pytest.fixture
def cdi_node(node: Node) -> Node:
    """The node with [cdi] spec_dirs = <tmp>/etc-cdi, <tmp>/run-cdi (created empty)."""
    dirs = [node.tmp / "etc-cdi", node.tmp / "run-cdi"]
    for d in dirs:
        d.mkdir()
    (node.tmp / "cdi-data").mkdir()
    (node.tmp / "cdi-data" / "hello").write_text("from the CDI mount\n")
    with open(node.proc.config, "a") as f:
        f.write(f"[cdi]\nspec_dirs = {json.dumps([str(d) for d in dirs])}\n")
    node.restart()
    return node


def out(node: Node, cid: str, *cmd: str) -> str:
    r = node.exec(cid, *cmd)
    assert r.exit_code == 0, (cmd, r.stderr)
    return r.stdout.decode()


def assert_refused(node: Node, sid: str, pod: pb.PodSandboxConfig, message: str,
                   **kw: Any) -> None:
    bundles = node.tmp / "state" / "bundles"
    before = sorted(p.name for p in bundles.iterdir())
    with pytest.raises(grpc.RpcError) as e:
        node.create(sid, pod, "refused", SLEEP, **kw)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (e.value.details() or ""), e.value.details()
    assert not [c for c in node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers
                if c.metadata.name == "refused"]
    assert sorted(p.name for p in bundles.iterdir()) == before
    assert not list((node.tmp / "root" / "snapshots").glob("*refused*"))


@pytest.mark.parametrize("handler", ["runc", "crun"])
def test_device_node_env_and_mount_inside_the_container(cdi_node: Node, handler: str) -> None:
    node = cdi_node
    (node.tmp / "etc-cdi" / "null.json").write_text(json.dumps(spec(node.tmp / "cdi-data")))
    pod = node.pod_config(f"cdi-{handler}")
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=pod, runtime_handler=handler)).pod_sandbox_id
    cid = node.run(sid, pod, "dev", SLEEP, CDI_devices=[pb.CDIDevice(name="pycri.test/null=null")])
    ls = out(node, cid, "ls", "-l", "/dev/cdi-null").split()
    assert ls[0].startswith("c") and ls[4] == f"{os.major(NULL.st_rdev)}," and \
        ls[5] == str(os.minor(NULL.st_rdev)), ls
    # The device cgroup lets the container use it.
    assert out(node, cid, "sh", "-c", "echo x > /dev/cdi-null && head -c1 /dev/cdi-null; echo ok"
               ) == "ok\n"
    env = out(node, cid, "env").splitlines()
    assert "CDI_TEST=yes" in env and "CDI_SPEC=1" in env
    assert out(node, cid, "cat", "/cdi-data/hello") == "from the CDI mount\n"
    mount = [line.split() for line in out(node, cid, "cat", "/proc/mounts").splitlines()
             if line.split()[1] == "/cdi-data"]
    assert mount and "ro" in mount[0][3].split(","), mount
    assert out(node, cid, "sh", "-c", "touch /cdi-data/x 2>/dev/null || echo read-only"
               ) == "read-only\n"


def test_annotation_requested_device_from_a_yaml_spec(cdi_node: Node) -> None:
    node = cdi_node
    ann = {"cdiVersion": "0.3.0", "kind": "pycri.test/ann",
           "devices": [{"name": "one", "containerEdits": {"env": ["ANN=one"]}},
                       {"name": "two", "containerEdits": {"env": ["ANN_TWO=2"]}}]}
    (node.tmp / "run-cdi" / "ann.yaml").write_text(yaml.safe_dump(ann))
    sid, pod = node.run_pod("cdi-ann")
    wanted = "pycri.test/ann=one,pycri.test/ann=two"
    cid = node.run(sid, pod, "ann", SLEEP, annotations={"cdi.k8s.io/pycri-test_ann": wanted})
    env = out(node, cid, "env").splitlines()
    assert "ANN=one" in env and "ANN_TWO=2" in env


def test_unknown_device_and_malformed_spec_create_nothing(cdi_node: Node) -> None:
    node = cdi_node
    (node.tmp / "etc-cdi" / "null.json").write_text(json.dumps(spec(node.tmp / "cdi-data")))
    bad = spec(node.tmp / "cdi-data")
    bad["kind"] = "pycri.test/bad"
    bad["devices"][0]["containerEdits"]["deviceNodes"][0]["type"] = "z"
    (node.tmp / "etc-cdi" / "bad.json").write_text(json.dumps(bad))
    sid, pod = node.run_pod("cdi-bad")
    assert_refused(node, sid, pod, "unknown CDI device pycri.test/null=nope",
                   CDI_devices=[pb.CDIDevice(name="pycri.test/null=nope")])
    assert_refused(node, sid, pod, f"invalid spec file {node.tmp / 'etc-cdi' / 'bad.json'}: "
                   "devices[0].containerEdits.deviceNodes[0].type: expected one of b, c",
                   annotations={"cdi.k8s.io/x": "pycri.test/bad=null"})
    assert_refused(node, sid, pod, "CDI device 'null' is not vendor.com/class=name",
                   CDI_devices=[pb.CDIDevice(name="null")])
    # The name was never taken, and the good device of the same dir still works.
    node.create(sid, pod, "refused", SLEEP, CDI_devices=[pb.CDIDevice(name="pycri.test/null=null")])


def test_a_spec_linked_to_etc_shadow_is_named_never_quoted(cdi_node: Node) -> None:
    """Issue 22, defect 7: the client's error named the link and quoted the first line
    of /etc/shadow (YAML read it as an unknown field); now it names the file only."""
    node = cdi_node
    for name in ("shadow.yaml", "shadow.json"):
        (node.tmp / "run-cdi" / name).symlink_to("/etc/shadow")
    users = [line.split(":", 1)[0] + ":" for line in Path("/etc/shadow").read_text(
        ).splitlines() if line]  # each line starts so; none may show
    sid, pod = node.run_pod("cdi-shadow")
    with pytest.raises(grpc.RpcError) as e:
        node.create(sid, pod, "refused", SLEEP, CDI_devices=[pb.CDIDevice(name="a.b/c=d")])
    details = e.value.details() or ""
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{node.tmp / 'run-cdi' / 'shadow.yaml'}: " in details, details
    assert f"{node.tmp / 'run-cdi' / 'shadow.json'}: " in details, details
    assert not [u for u in users if u in details], details


def test_an_edited_spec_takes_effect_on_the_next_create(cdi_node: Node) -> None:
    node = cdi_node
    path = node.tmp / "etc-cdi" / "null.json"
    path.write_text(json.dumps(spec(node.tmp / "cdi-data", "CDI_TEST=first")))
    sid, pod = node.run_pod("cdi-edit")
    dev = [pb.CDIDevice(name="pycri.test/null=null")]
    first = node.run(sid, pod, "first", SLEEP, CDI_devices=dev)
    path.write_text(json.dumps(spec(node.tmp / "cdi-data", "CDI_TEST=second-version")))
    second = node.run(sid, pod, "second", SLEEP, CDI_devices=dev)
    assert "CDI_TEST=first" in out(node, first, "env").splitlines()
    assert "CDI_TEST=second-version" in out(node, second, "env").splitlines()
