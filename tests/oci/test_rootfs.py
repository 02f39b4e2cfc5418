"""rootfs.py: walking a hostile image's tree from the host, and checking mount destinations."""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from pycri.errors import InvalidArgument
from pycri.oci import rootfs


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "rootfs"
    for d in ("dev", "proc", "sys", "etc", "run", "var", "data"):
        (r / d).mkdir(parents=True)
    (r / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    return r


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host directory a hostile image points at."""
    h = tmp_path / "host"
    h.mkdir()
    (h / "ptmx").write_text("host file\n")
    return h


def _bind(dest: str, source: str) -> dict[str, Any]:
    return {"destination": dest, "type": "bind", "source": source, "options": ["rbind"]}


def _doc(tmp_path: Path, *extra: dict[str, Any]) -> dict[str, Any]:
    pod_file = tmp_path / "podfile"
    pod_file.write_text("x\n")
    volume = tmp_path / "volume"
    volume.mkdir(exist_ok=True)
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs"},
        _bind("/etc/hosts", str(pod_file)),
        _bind("/etc/resolv.conf", str(pod_file)),
        *extra,
    ]
    return {"mounts": mounts, "linux": {"devices": []}}


def test_links_resolve_inside_the_root(root: Path, tmp_path: Path) -> None:
    """Absolute links restart at the rootfs, `..` stops at it, relative links stay put."""
    os.symlink("/run", root / "var" / "run")
    os.symlink("../etc/hosts", root / "data" / "h")
    os.symlink("../../../../..", root / "data" / "up")
    vol = str(tmp_path / "volume")
    doc = _doc(tmp_path, _bind("/var/run/secrets/x", vol),
               _bind("/data/h", str(tmp_path / "podfile")), _bind("/data/up/etc/y", vol))
    rootfs.pin_mount_destinations(str(root), doc)
    assert [m["destination"] for m in doc["mounts"][6:]] == [
        "/run/secrets/x", "/etc/hosts", "/etc/y"]


def test_clean_image_passes_and_keeps_destinations(root: Path, tmp_path: Path) -> None:
    doc = _doc(tmp_path, _bind("/data/vol", str(tmp_path / "volume")))
    want = copy.deepcopy(doc)
    rootfs.pin_mount_destinations(str(root), doc)
    assert doc == want


def test_destination_through_a_symlink_is_pinned_inside(root: Path, tmp_path: Path,
                                                        host: Path) -> None:
    """/var/run -> /run is in every Debian image: the mount goes to <rootfs>/run/…, and the
    runtime is given that path, never the link (an absolute link to a host dir included)."""
    os.symlink("/run", root / "var" / "run")
    os.symlink(str(host), root / "data" / "out")
    doc = _doc(tmp_path, _bind("/var/run/secrets/sa", str(tmp_path / "volume")),
               _bind("/data/out/x", str(tmp_path / "volume")))
    rootfs.pin_mount_destinations(str(root), doc)
    dests = [m["destination"] for m in doc["mounts"]]
    assert dests[-2:] == ["/run/secrets/sa", f"{host}/x"]
    assert sorted(os.listdir(host)) == ["ptmx"]


@pytest.mark.parametrize("link", ["dev", "proc", "sys"])
def test_runtime_owned_directory_as_symlink_is_refused(root: Path, tmp_path: Path, host: Path,
                                                       link: str) -> None:
    (root / link).rmdir()
    os.symlink(str(host), root / link)
    with pytest.raises(InvalidArgument, match=f"the image's /{link} is a symlink"):
        rootfs.pin_mount_destinations(str(root), _doc(tmp_path))


def test_runtime_owned_relative_symlink_inside_is_refused_too(root: Path, tmp_path: Path) -> None:
    (root / "dev").rmdir()
    (root / "realdev").mkdir()
    os.symlink("realdev", root / "dev")
    with pytest.raises(InvalidArgument, match="/dev is a symlink"):
        rootfs.pin_mount_destinations(str(root), _doc(tmp_path))


@pytest.mark.parametrize("target", ["/etc/shadow", "../../../../etc/shadow"])
def test_pod_file_symlink_leaving_the_rootfs_is_refused(root: Path, tmp_path: Path,
                                                        target: str) -> None:
    (root / "etc" / "hosts").unlink()
    os.symlink(target, root / "etc" / "hosts")
    with pytest.raises(InvalidArgument, match="the image's /etc/hosts is a symlink"):
        rootfs.pin_mount_destinations(str(root), _doc(tmp_path))


def test_pod_file_relative_symlink_inside_is_pinned(root: Path, tmp_path: Path) -> None:
    """systemd images ship /etc/resolv.conf -> ../run/systemd/resolve/stub-resolv.conf."""
    os.symlink("../run/systemd/resolve/stub-resolv.conf", root / "etc" / "resolv.conf")
    doc = _doc(tmp_path)
    rootfs.pin_mount_destinations(str(root), doc)
    assert doc["mounts"][5]["destination"] == "/run/systemd/resolve/stub-resolv.conf"


@pytest.mark.parametrize(("make", "dest", "message"), [
    (lambda r: os.mkfifo(r / "etc" / "resolv.conf"), "/etc/resolv.conf",
     "/etc/resolv.conf is a FIFO in the image; the mount needs a regular file"),
    (lambda r: os.mknod(r / "etc" / "resolv.conf", 0o600 | stat.S_IFCHR, os.makedev(1, 3)),
     "/etc/resolv.conf", "is a character device in the image"),
    (lambda r: ((r / "etc" / "hosts").unlink(), (r / "etc" / "hosts").mkdir()), "/etc/hosts",
     "/etc/hosts is a directory in the image; the mount needs a regular file"),
    (lambda r: ((r / "proc").rmdir(), (r / "proc").write_text("")), "/proc",
     "/proc is a regular file in the image; the mount needs a directory"),
])  # fmt: skip
def test_destination_that_is_not_what_the_mount_needs(root: Path, tmp_path: Path, make: Any,
                                                      dest: str, message: str) -> None:
    make(root)
    with pytest.raises(InvalidArgument, match=message):
        rootfs.pin_mount_destinations(str(root), _doc(tmp_path))


def test_parent_that_is_not_a_directory(root: Path, tmp_path: Path) -> None:
    (root / "data").rmdir()
    (root / "data").write_text("")
    with pytest.raises(InvalidArgument, match="/data in the image is not a directory"):
        rootfs.pin_mount_destinations(
            str(root), _doc(tmp_path, _bind("/data/vol", str(tmp_path / "volume"))))


def test_inside_an_earlier_mount_is_not_the_images(root: Path, tmp_path: Path, host: Path) -> None:
    """/dev/pts lies in the /dev tmpfs: whatever the image has there is hidden, not refused."""
    (root / "dev" / "pts").symlink_to(host)
    doc = _doc(tmp_path)
    rootfs.pin_mount_destinations(str(root), doc)
    assert doc["mounts"][2]["destination"] == "/dev/pts"


def test_symlink_loop_is_refused(root: Path, tmp_path: Path) -> None:
    os.symlink("/data/b", root / "data" / "a")
    os.symlink("/data/a", root / "data" / "b")
    with pytest.raises(InvalidArgument, match="too many levels of symlinks"):
        rootfs.pin_mount_destinations(
            str(root), _doc(tmp_path, _bind("/data/a/x", str(tmp_path / "volume"))))


def test_device_path_through_a_symlink_is_refused(root: Path, tmp_path: Path,
                                                  host: Path) -> None:
    os.symlink(str(host), root / "data" / "devs")
    doc = _doc(tmp_path)
    doc["linux"]["devices"] = [{"path": "/data/devs/null", "type": "c", "major": 1, "minor": 3}]
    with pytest.raises(InvalidArgument, match="/data/devs is a symlink"):
        rootfs.pin_mount_destinations(str(root), doc)


def test_read_file_refuses_oversized_before_reading(root: Path) -> None:
    with open(root / "etc" / "big", "wb") as f:
        f.truncate(1 << 20)
    with pytest.raises(InvalidArgument, match="/etc/big in the image is larger than 1000 bytes"):
        rootfs.read_file(str(root), "/etc/big", 1000)
    assert rootfs.read_file(str(root), "/etc/missing", 1000) is None
    assert rootfs.read_file(str(root), "/etc/hosts", 1000) == b"127.0.0.1 localhost\n"
