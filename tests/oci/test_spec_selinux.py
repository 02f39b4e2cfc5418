"""SELinux fields in the pure spec generator, with the host's SELinux on and off.

This host has no SELinux, so the "enabled" side is only testable here: the managers
pass `selinux.enabled()` in, the generator never looks at the host itself.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pycri.api import api_pb2 as pb
from pycri.oci import selinux
from pycri.oci.spec.build import SandboxContext, sandbox_spec

from .specutil import build, container_config, mount_at, sandbox_config

POD_LEVEL = pb.SELinuxOption(level="s0:c1,c2")
FULL = pb.SELinuxOption(user="user_u", role="user_r", type="spc_t", level="s0:c7,c9")
SANDBOX_CTX = SandboxContext(sandbox_id="s1", rootfs="/r/s1/rootfs")


def pod(options: pb.SELinuxOption | None = None) -> pb.PodSandboxConfig:
    cfg = sandbox_config()
    if options is not None:
        cfg.linux.security_context.selinux_options.CopyFrom(options)
    return cfg


def container(options: pb.SELinuxOption | None = None, relabel: bool = True) -> Any:
    cfg = container_config()
    if options is not None:
        cfg.linux.security_context.selinux_options.CopyFrom(options)
    cfg.mounts.add(container_path="/data", host_path="/srv/data", selinux_relabel=relabel)
    cfg.mounts.add(container_path="/plain", host_path="/srv/plain")
    cfg.mounts.add(container_path="/img", image=pb.ImageSpec(image="busybox"),
                   readonly=True, selinux_relabel=True)
    return cfg


def build_container(cfg: pb.ContainerConfig, sb: pb.PodSandboxConfig, on: bool) -> Any:
    return build(cfg, sb, selinux_enabled=on, mount_sources={"image-volume:2": "/views/v2"})


def test_disabled_host_ignores_every_selinux_field() -> None:
    s = build_container(container(FULL), pod(POD_LEVEL), on=False)
    assert "selinuxLabel" not in s["process"] and "mountLabel" not in s["linux"]
    assert "z" not in mount_at(s, "/data")["options"]
    infra = sandbox_spec(pod(FULL), SANDBOX_CTX)
    assert "selinuxLabel" not in infra["process"] and "mountLabel" not in infra["linux"]


def test_enabled_container_label_from_its_own_options() -> None:
    s = build_container(container(FULL), pod(POD_LEVEL), on=True)
    assert s["process"]["selinuxLabel"] == "user_u:user_r:spc_t:s0:c7,c9"
    # files keep the file type and object role; user and level follow the option
    assert s["linux"]["mountLabel"] == "user_u:object_r:container_file_t:s0:c7,c9"


def test_enabled_container_inherits_the_pods_options() -> None:
    s = build_container(container(None), pod(POD_LEVEL), on=True)
    assert s["process"]["selinuxLabel"] == "system_u:system_r:container_t:s0:c1,c2"
    assert s["linux"]["mountLabel"] == "system_u:object_r:container_file_t:s0:c1,c2"


def test_enabled_without_options_sets_no_label() -> None:
    s = build_container(container(None), pod(None), on=True)
    assert "selinuxLabel" not in s["process"] and "mountLabel" not in s["linux"]


def test_enabled_relabel_adds_z_to_host_binds_only() -> None:
    s = build_container(container(None), pod(None), on=True)
    assert mount_at(s, "/data")["options"].count("z") == 1
    assert "z" not in mount_at(s, "/plain")["options"]
    assert "z" not in mount_at(s, "/img")["options"]  # a read-only image view


def test_enabled_sandbox_labels() -> None:
    on = replace(SANDBOX_CTX, selinux_enabled=True)
    s = sandbox_spec(pod(POD_LEVEL), on)
    assert s["process"]["selinuxLabel"] == "system_u:system_r:container_t:s0:c1,c2"
    assert s["linux"]["mountLabel"] == "system_u:object_r:container_file_t:s0:c1,c2"
    assert "selinuxLabel" not in sandbox_spec(pod(None), on)["process"]


def test_enabled_probe(tmp_path: Path) -> None:
    assert not selinux.enabled(tmp_path)
    (tmp_path / "enforce").write_text("0\n")  # permissive still labels
    assert selinux.enabled(tmp_path)


def test_one_debug_line_per_field_present(caplog: pytest.LogCaptureFixture) -> None:
    cfg = container(FULL)
    cfg.mounts.add(container_path="/more", host_path="/srv/more", selinux_relabel=True)
    with caplog.at_level(logging.DEBUG, logger="pycri.oci.selinux"):
        selinux.ignored("container c1", selinux.container_fields(cfg))
        selinux.ignored("pod sandbox s1", selinux.sandbox_fields(pod(None)))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "container c1: linux.security_context.selinux_options ignored: "
        "SELinux is not enabled on this host",
        "container c1: mounts[0,2,3].selinux_relabel ignored: "
        "SELinux is not enabled on this host",
    ]
