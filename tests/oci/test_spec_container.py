"""container_spec(): the assembly — a whole spec, privileged containers, annotations."""

from __future__ import annotations

import json

import pytest

from pycri.devices import DeviceInfo
from pycri.errors import InvalidArgument
from pycri.oci.seccomp import default_profile
from pycri.oci.spec.capabilities import ALL_CAPABILITIES

from .specutil import build, container_config, mount_at, privileged_spec


def test_is_plain_json_and_deterministic() -> None:
    a, b = build(), build()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a["ociVersion"] == "1.0.2"
    assert a["root"] == {"path": "/r/rootfs", "readonly": False}


# ---- privileged


def test_privileged_needs_privileged_sandbox() -> None:
    cfg = container_config()
    cfg.linux.security_context.privileged = True
    with pytest.raises(InvalidArgument, match="privileged sandbox"):
        build(cfg)


def test_privileged() -> None:
    host = (DeviceInfo("/dev/sda", "b", 8, 0, 0o660, 0, 6),)
    s = privileged_spec(host_devices=host, seccomp=default_profile())
    assert s["process"]["capabilities"]["bounding"] == list(ALL_CAPABILITIES)
    linux = s["linux"]
    assert "maskedPaths" not in linux and "readonlyPaths" not in linux
    assert "seccomp" not in linux
    assert linux["devices"] == [
        {"path": "/dev/sda", "type": "b", "major": 8, "minor": 0, "fileMode": 0o660,
         "uid": 0, "gid": 6}
    ]  # fmt: skip
    assert linux["resources"]["devices"] == [{"allow": True, "access": "rwm"}]
    assert "rw" in mount_at(s, "/sys")["options"]
    assert "rw" in mount_at(s, "/sys/fs/cgroup")["options"]


def test_unprivileged_sys_ro_and_devices_denied() -> None:
    s = build(host_devices=(DeviceInfo("/dev/sda", "b", 8, 0),))
    assert "ro" in mount_at(s, "/sys")["options"]
    assert "ro" in mount_at(s, "/sys/fs/cgroup")["options"]
    assert s["linux"]["devices"] == []
    assert s["linux"]["resources"]["devices"] == [{"allow": False, "access": "rwm"}]


def test_cri_devices() -> None:
    dev = DeviceInfo("/dev/xnull", "c", 1, 3, 0o666, 0, 0, "rw")
    s = build(devices=(dev,))
    assert s["linux"]["devices"][0]["path"] == "/dev/xnull"
    assert s["linux"]["resources"]["devices"] == [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"},
    ]


# ---- annotations


def test_annotations() -> None:
    cfg = container_config()
    cfg.annotations["user"] = "x"
    cfg.annotations["io.kubernetes.cri.container-type"] = "forged"
    a = build(cfg)["annotations"]
    assert a["user"] == "x"
    assert a["io.kubernetes.cri.container-type"] == "container"
    assert a["io.kubernetes.cri.sandbox-id"] == "s1"
    assert a["io.kubernetes.cri.container-name"] == "ctr"
    assert a["io.kubernetes.cri.sandbox-name"] == "pod"
    assert a["io.kubernetes.cri.sandbox-namespace"] == "ns"
    assert a["io.kubernetes.cri.sandbox-uid"] == "uid-1"
    assert a["io.kubernetes.cri.image-name"] == "docker.io/library/busybox:latest"
