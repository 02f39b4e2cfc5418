"""CDI edits on an OCI spec: pure, ordered, later wins; through container_spec too."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pycri.cdi import edits
from pycri.cdi.registry import Registry
from pycri.cdi.schema import ContainerEdits, DeviceNode, Hook, IntelRdt, Mount
from pycri.errors import InvalidArgument
from tests.oci.specutil import build

NODE = DeviceNode(path="/dev/cdi-null", type="c", major=1, minor=3, file_mode=0o666,
                  permissions="rw")
EDITS = ContainerEdits(
    env=("PATH=/cdi/bin", "NEW=1"),
    device_nodes=(NODE,),
    mounts=(Mount(host_path="/etc", container_path="/a/b", options=("rbind", "ro")),
            Mount(host_path="tmpfs", container_path="/a", type="tmpfs")),
    hooks=(Hook(hook_name="createContainer", path="/bin/true", args=("true",), timeout=5),),
    additional_gids=(0, 44, 44),
    intel_rdt=IntelRdt(clos_id="gold"),
)


def test_apply_is_pure_and_puts_every_edit_in_place() -> None:
    base = build()
    before = copy.deepcopy(base)
    out = edits.apply(base, [EDITS])
    assert base == before
    env = out["process"]["env"]
    assert "PATH=/cdi/bin" in env and env[-1] == "NEW=1"
    assert env.index("PATH=/cdi/bin") == [e.split("=")[0] for e in before["process"]["env"]
                                          ].index("PATH")  # replaced where it was
    assert out["linux"]["devices"][-1] == {"path": "/dev/cdi-null", "type": "c", "major": 1,
                                           "minor": 3, "fileMode": 0o666}
    assert out["linux"]["resources"]["devices"][-1] == {"allow": True, "type": "c", "major": 1,
                                                        "minor": 3, "access": "rw"}
    dests = [m["destination"] for m in out["mounts"]]
    assert dests.index("/a") < dests.index("/a/b")  # parents first, whatever the order given
    assert {"destination": "/a", "source": "tmpfs", "type": "tmpfs", "options": []} in out[
        "mounts"]
    assert out["hooks"]["createContainer"] == [{"path": "/bin/true", "args": ["true"],
                                                "timeout": 5}]
    assert out["process"]["user"]["additionalGids"].count(44) == 1
    assert 0 not in out["process"]["user"]["additionalGids"][len(
        before["process"]["user"].get("additionalGids", [])):]
    assert out["linux"]["intelRdt"] == {"closID": "gold"}


def test_later_edits_win_on_the_same_key() -> None:
    later = ContainerEdits(env=("NEW=2",), device_nodes=(
        DeviceNode(path="/dev/cdi-null", type="c", major=1, minor=5),),
        mounts=(Mount(host_path="/tmp", container_path="/a/b"),))
    out = edits.apply(build(), [EDITS, later])
    assert [e for e in out["process"]["env"] if e.startswith("NEW=")] == ["NEW=2"]
    assert [d["minor"] for d in out["linux"]["devices"] if d["path"] == "/dev/cdi-null"] == [5]
    (m,) = [m for m in out["mounts"] if m["destination"] == "/a/b"]
    assert m["source"] == "/tmp" and m["type"] == "bind"


def test_an_uncompleted_device_node_is_a_bug_not_a_silent_zero() -> None:
    with pytest.raises(ValueError, match="not completed"):
        edits.apply(build(), [ContainerEdits(device_nodes=(DeviceNode(path="/dev/x"),))])


def test_container_spec_applies_the_resolved_edits_last() -> None:
    plain, with_cdi = build(), build(cdi_edits=(EDITS,))
    assert with_cdi == edits.apply(plain, [EDITS])
    assert build(cdi_edits=()) == plain


def test_inject_fits_the_nri_resolver_shape(tmp_path: Path) -> None:
    (tmp_path / "v.json").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": "example.com/dev", "devices": [{"name": "null",
        "containerEdits": {"deviceNodes": [{"path": "/dev/cdi-null", "hostPath": "/dev/null"}],
                           "env": ["CDI=1"]}}]}))
    r = Registry([str(tmp_path)], 1 << 20, 16)
    out = r.inject(build(), ["example.com/dev=null"])
    assert "CDI=1" in out["process"]["env"]
    assert out["linux"]["devices"][-1]["path"] == "/dev/cdi-null"
    with pytest.raises(InvalidArgument, match=r"is not vendor\.com/class=name"):
        r.inject(build(), ["null"])
