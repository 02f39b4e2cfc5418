"""oci/spec/mounts.py: the default mounts, the pod's files and the CRI mounts."""

from __future__ import annotations

from typing import Any

import pytest

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci import bindopts
from pycri.oci.spec.mounts import cri_mounts, image_volume_key, rro_key

from .specutil import build, container_config, mount_at


def test_default_mounts_present() -> None:
    s = build()
    dests = [m["destination"] for m in s["mounts"]]
    for d in ("/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/sys/fs/cgroup",
              "/etc/hosts", "/etc/resolv.conf", "/etc/hostname"):  # fmt: skip
        assert dests.count(d) == 1, d
    assert dests.index("/dev") < dests.index("/dev/pts")
    assert mount_at(s, "/dev/shm")["source"] == "/s/shm"
    assert mount_at(s, "/etc/hosts")["source"] == "/s/hosts"
    assert mount_at(s, "/etc/resolv.conf")["source"] == "/s/resolv.conf"
    assert mount_at(s, "/etc/hostname")["type"] == "bind"


def test_pod_files_absent_are_skipped_and_shm_falls_back_to_tmpfs() -> None:
    s = build(hosts_path=None, resolv_conf_path=None, hostname_path=None, shm_path=None)
    dests = [m["destination"] for m in s["mounts"]]
    assert "/etc/hosts" not in dests and "/etc/resolv.conf" not in dests
    assert mount_at(s, "/dev/shm")["type"] == "tmpfs"


def cri_mount(**kw: Any) -> dict[str, Any]:
    cfg = container_config()
    cfg.mounts.add(**kw)
    s = build(cfg)
    return {"mount": mount_at(s, str(kw["container_path"]).rstrip("/")), "spec": s}


def test_cri_mount_private_rw() -> None:
    r = cri_mount(container_path="/data", host_path="/host/data")
    assert r["mount"] == {"destination": "/data", "type": "bind", "source": "/host/data",
                          "options": ["rbind", "rprivate", "rw"]}  # fmt: skip
    assert "rootfsPropagation" not in r["spec"]["linux"]


def test_cri_mount_readonly_and_rro() -> None:
    m = cri_mount(container_path="/d", host_path="/h", readonly=True)["mount"]
    assert m["options"] == ["rbind", "rprivate", "ro"]
    mount = pb.Mount(container_path="/d", host_path="/h", readonly=True,
                     recursive_read_only=True)
    out, _ = cri_mounts([mount], {"/h": "/h", rro_key(0): "/staged/0"})
    assert out == [{"destination": "/d", "type": "bind", "source": "/staged/0",
                    "options": ["rbind", "rprivate", "ro"]}]  # fmt: skip
    with pytest.raises(InvalidArgument, match="not staged"):
        cri_mounts([mount], {"/h": "/h"})


def test_mount_options_merge_into_the_bind() -> None:
    m = cri_mount(container_path="/d", host_path="/h",
                  mount_options=["noexec", "nosuid", "nodev", "noexec"])["mount"]
    assert m["options"] == ["rbind", "rprivate", "rw", "noexec", "nosuid", "nodev"]
    # ro wins over rw both ways: a request can tighten a mount, never loosen it.
    assert cri_mount(container_path="/d", host_path="/h", mount_options=["ro"])["mount"][
        "options"] == ["rbind", "rprivate", "ro"]
    assert cri_mount(container_path="/d", host_path="/h", readonly=True,
                     mount_options=["rw", "exec"])["mount"]["options"] == [
        "rbind", "rprivate", "ro", "exec"]
    image = pb.Mount(container_path="/i", image=pb.ImageSpec(image="img"), readonly=True,
                     mount_options=["nodev"])
    out, _ = cri_mounts([image], {image_volume_key(0): "/views/0"})
    assert out[0]["options"] == ["rbind", "rprivate", "ro", "nodev"]
    rro = pb.Mount(container_path="/d", host_path="/h", readonly=True,
                   recursive_read_only=True, mount_options=["noexec"])
    out, _ = cri_mounts([rro], {rro_key(0): "/staged/0"})
    assert out[0]["options"] == ["rbind", "rprivate", "ro", "noexec"]


def test_bind_option_merge_rules() -> None:
    assert bindopts.merge(["rbind", "rw", "exec"], ["noexec"]) == ["rbind", "rw", "noexec"]
    assert bindopts.merge(["rw"], ["nosuid", "suid", "dev", "nodev"]) == [
        "rw", "nosuid", "nodev"]
    assert bindopts.merge(["rw"], ["noatime", "strictatime", "relatime"]) == ["rw", "relatime"]
    assert bindopts.merge(["ro"], ["ro", "ro"]) == ["ro"]
    assert bindopts.option_problem("noexec") is None
    assert "'mode=0755' is not a bind-mount option" in str(bindopts.option_problem("mode=0755"))
    assert bindopts.mount_attrs(["ro", "noexec", "nosuid", "nodev", "relatime"]) == 0xF


def test_rro_needs_readonly_and_private() -> None:
    with pytest.raises(InvalidArgument, match="needs readonly"):
        cri_mount(container_path="/d", host_path="/h", recursive_read_only=True)
    with pytest.raises(InvalidArgument, match="private propagation"):
        cri_mount(container_path="/d", host_path="/h", readonly=True, recursive_read_only=True,
                  propagation=pb.PROPAGATION_HOST_TO_CONTAINER)  # fmt: skip


def test_propagation_and_rootfs_propagation() -> None:
    r = cri_mount(container_path="/d", host_path="/h", propagation=pb.PROPAGATION_HOST_TO_CONTAINER)
    assert "rslave" in r["mount"]["options"]
    assert r["spec"]["linux"]["rootfsPropagation"] == "rslave"
    cfg = container_config()
    cfg.mounts.add(container_path="/a", host_path="/h", propagation=pb.PROPAGATION_BIDIRECTIONAL)
    cfg.mounts.add(
        container_path="/b", host_path="/h", propagation=pb.PROPAGATION_HOST_TO_CONTAINER
    )
    s = build(cfg)
    assert "rshared" in mount_at(s, "/a")["options"]
    assert s["linux"]["rootfsPropagation"] == "rshared"


def test_cri_mount_replaces_default_and_resolved_source() -> None:
    cfg = container_config()
    cfg.mounts.add(container_path="/etc/hosts/", host_path="/link/hosts")
    s = build(cfg, mount_sources={"/link/hosts": "/real/hosts"})
    m = mount_at(s, "/etc/hosts")
    assert m["source"] == "/real/hosts"


def test_cri_mounts_sorted_parents_first() -> None:
    cfg = container_config()
    cfg.mounts.add(container_path="/data/sub/x", host_path="/h1")
    cfg.mounts.add(container_path="/data", host_path="/h2")
    dests = [m["destination"] for m in build(cfg)["mounts"]]
    assert dests.index("/data") < dests.index("/data/sub/x")


@pytest.mark.parametrize(
    ("path", "host", "message"),
    [("rel", "/h", "absolute"), ("/", "/h", "container's /"), ("/x", "", "host path is empty")],
)
def test_bad_cri_mounts(path: str, host: str, message: str) -> None:
    cfg = container_config()
    cfg.mounts.add(container_path=path, host_path=host)
    with pytest.raises(InvalidArgument, match=message):
        build(cfg)
