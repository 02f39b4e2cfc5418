"""oci/spec/security.py: read-only root, no_new_privs, masked/read-only paths, seccomp, AppArmor."""

from __future__ import annotations

import json

import pytest

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci.seccomp import default_profile
from pycri.oci.spec.security import DEFAULT_MASKED_PATHS, DEFAULT_READONLY_PATHS

from .specutil import build, container_config, mount_at


def test_readonly_rootfs_and_no_new_privs() -> None:
    cfg = container_config()
    cfg.linux.security_context.readonly_rootfs = True
    cfg.linux.security_context.no_new_privs = True
    s = build(cfg)
    assert s["root"]["readonly"] is True
    assert s["process"]["noNewPrivileges"] is True
    assert "ro" in mount_at(s, "/etc/hosts")["options"]
    assert build()["process"]["noNewPrivileges"] is False
    assert "rw" in mount_at(build(), "/etc/hosts")["options"]


def test_masked_and_readonly_paths() -> None:
    s = build()
    assert s["linux"]["maskedPaths"] == list(DEFAULT_MASKED_PATHS)
    assert s["linux"]["readonlyPaths"] == list(DEFAULT_READONLY_PATHS)
    cfg = container_config()
    cfg.linux.security_context.masked_paths.append("/proc/x")
    cfg.linux.security_context.readonly_paths.append("/proc/y")
    s = build(cfg)
    assert s["linux"]["maskedPaths"] == ["/proc/x"]
    assert s["linux"]["readonlyPaths"] == ["/proc/y"]


def test_seccomp_from_context_gated_by_caps() -> None:
    assert "seccomp" not in build()["linux"]
    s = build(seccomp=default_profile())
    names = {n for r in s["linux"]["seccomp"]["syscalls"] for n in r["names"]}
    assert "unshare" not in names
    cfg = container_config()
    cfg.linux.security_context.capabilities.add_capabilities.append("SYS_ADMIN")
    s = build(cfg, seccomp=default_profile())
    names = {n for r in s["linux"]["seccomp"]["syscalls"] for n in r["names"]}
    assert "unshare" in names
    assert "capabilities" not in json.dumps(s["linux"]["seccomp"])


def test_apparmor_without_host_support() -> None:
    cfg = container_config()
    aa = cfg.linux.security_context.apparmor
    aa.profile_type = pb.SecurityProfile.RuntimeDefault
    assert "apparmorProfile" not in build(cfg)["process"]
    aa.profile_type = pb.SecurityProfile.Localhost
    aa.localhost_ref = "my-profile"
    with pytest.raises(InvalidArgument, match=r"'my-profile'.*AppArmor is not enabled"):
        build(cfg)
    cfg2 = container_config()
    cfg2.linux.security_context.apparmor_profile = "localhost/other"
    with pytest.raises(InvalidArgument, match="'other'"):
        build(cfg2)


def test_apparmor_with_host_support() -> None:
    cfg = container_config()
    cfg.linux.security_context.apparmor.profile_type = pb.SecurityProfile.Localhost
    cfg.linux.security_context.apparmor.localhost_ref = "localhost/p1"
    assert build(cfg, apparmor_enabled=True)["process"]["apparmorProfile"] == "p1"
    s = build(apparmor_enabled=True, apparmor_default_profile="pycri-default")
    assert s["process"]["apparmorProfile"] == "pycri-default"
    cfg.linux.security_context.apparmor.profile_type = pb.SecurityProfile.Unconfined
    assert "apparmorProfile" not in build(cfg, apparmor_enabled=True)["process"]
