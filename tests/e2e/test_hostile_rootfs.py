"""Hostile images against the rootfs: symlinks out of it, device nodes and FIFOs where the
daemon reads, oversized files. One image per attack, built from busybox and pushed to the
test registry; each create gets a clear InvalidArgument under runc and crun alike, and a
host canary directory they point at is unchanged byte for byte (issue 8, defects 3 and 9).
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.lib import images
from tests.lib.registry import Registry

HANDLERS = ["runc", "crun"]


def _snapshot(root: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every entry under `root`: inode, mode, size and content hash (or link target)."""
    out: dict[str, tuple[int, int, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st = p.lstat()
            if p.is_symlink():
                body = os.readlink(p)
            elif p.is_file():
                body = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                body = ""
            out[str(p.relative_to(root))] = (st.st_ino, st.st_mode, st.st_size, body)
    return out


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The host directory the hostile images point at; it must never change."""
    d = tmp_path_factory.mktemp("canary")
    (d / "ptmx").write_text("host ptmx, must not be replaced\n")
    (d / "shadow").write_text("root:host-secret:19000:0:99999:7:::\n")
    (d / "sub").mkdir()
    (d / "sub" / "keep").write_text("keep\n")
    yield d


def _with(base_replace: dict[str, images.Entry], *extra: images.Entry) -> images.ImageSpec:
    layers = images.busybox_layers()
    layers[0] = [base_replace.get(e.name, e) for e in layers[0]]
    if extra:
        layers.append(list(extra))
    return images.ImageSpec(layers=layers)


@pytest.fixture(scope="module")
def hostile(registry: Registry, canary: Path,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """name → pushed image ref, one image per attack."""
    chr_passwd = images.Entry("etc/passwd", tarfile.CHRTYPE, mode=0o644, devmajor=1, devminor=3)
    fifo_passwd = images.Entry("etc/passwd", tarfile.FIFOTYPE, mode=0o644)
    specs = {
        "dev-to-host": _with({"dev": images.symlink("dev", str(canary))}),
        "proc-to-host": _with({"proc": images.symlink("proc", str(canary))}),
        "sys-to-host": _with({"sys": images.symlink("sys", str(canary))}),
        "hosts-to-host-file": _with({}, images.symlink("etc/hosts", str(canary / "shadow"))),
        "resolv-climbs-out": _with({}, images.symlink("etc/resolv.conf",
                                                      "../../../../../../../" + str(canary))),
        "dev-is-a-file": _with({"dev": images.file("dev", "not a directory\n")}),
        "passwd-device": _with({}, chr_passwd),
        "passwd-fifo": _with({}, fifo_passwd),
        "passwd-huge": _with({}, images.file("etc/passwd", b"x" * (5 << 20))),
        "mount-dest-out": _with({}, images.symlink("var/out", str(canary))),
        # Not hostile: what Debian and systemd images ship; must keep working.
        "debian-like": _with({}, images.symlink("var/run", "/run"),
                             images.symlink("etc/resolv.conf",
                                            "../run/systemd/resolve/stub-resolv.conf")),
    }
    layout = tmp_path_factory.mktemp("hostile-layout")
    return {name: images.push_image(registry.addr, layout, f"hostile-{name}", "t", [s])
            for name, s in specs.items()}


REFUSED = {
    "dev-to-host": "the image's /dev is a symlink",
    "proc-to-host": "the image's /proc is a symlink",
    "sys-to-host": "the image's /sys is a symlink",
    "hosts-to-host-file": "the image's /etc/hosts is a symlink",
    "resolv-climbs-out": "the image's /etc/resolv.conf is a symlink",
    "dev-is-a-file": "mount destination /dev is a regular file in the image",
    "passwd-device": "/etc/passwd in the image is a character device, not a regular file",
    "passwd-fifo": "/etc/passwd in the image is a FIFO, not a regular file",
    "passwd-huge": "/etc/passwd in the image is larger than 4194304 bytes",
}


def _pod(node: Node, name: str, handler: str) -> tuple[str, pb.PodSandboxConfig]:
    cfg = node.pod_config(f"{name}-{handler}")
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=cfg, runtime_handler=handler)).pod_sandbox_id
    return sid, cfg


def _wait_exited(node: Node, cid: str) -> pb.ContainerStatus:
    deadline = time.monotonic() + 60
    while node.status(cid).state != pb.CONTAINER_EXITED and time.monotonic() < deadline:
        time.sleep(0.1)
    return node.status(cid)


def _pull(node: Node, ref: str) -> None:
    node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)))


@pytest.mark.parametrize("handler", HANDLERS)
@pytest.mark.parametrize("attack", sorted(REFUSED))
def test_hostile_rootfs_is_refused_and_host_unchanged(
    node: Node, hostile: dict[str, str], canary: Path, handler: str, attack: str
) -> None:
    before = _snapshot(canary)
    _pull(node, hostile[attack])
    sid, pod = _pod(node, attack, handler)
    cfg = node.container_config("victim", ["sleep", "30"])
    cfg.image.image = hostile[attack]
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=sid, config=cfg, sandbox_config=pod))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert REFUSED[attack] in (e.value.details() or "")
    assert _snapshot(canary) == before
    # Nothing of the refused container is left: no record, and its rootfs went with it.
    assert not node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers
    assert not list((node.tmp / "root" / "snapshots").glob("*/upper/*"))


@pytest.mark.parametrize("handler", HANDLERS)
def test_mount_destination_through_symlink_out_stays_in_rootfs(
    node: Node, hostile: dict[str, str], canary: Path, tmp_path: Path, handler: str
) -> None:
    """/var/out -> <canary> in the image: a volume at /var/out/x lands inside the rootfs
    (where the container sees it through its own symlink), never in the host canary."""
    before = _snapshot(canary)
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "marker").write_text("from the volume\n")
    _pull(node, hostile["mount-dest-out"])
    sid, pod = _pod(node, "destout", handler)
    cfg = node.container_config("reader", ["cat", "/var/out/x/marker"])
    cfg.image.image = hostile["mount-dest-out"]
    cfg.mounts.append(pb.Mount(container_path="/var/out/x", host_path=str(volume)))
    cid = node.cri.runtime.CreateContainer(
        pb.CreateContainerRequest(pod_sandbox_id=sid, config=cfg, sandbox_config=pod)
    ).container_id
    node.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=cid))
    st = _wait_exited(node, cid)
    assert (st.state, st.exit_code) == (pb.CONTAINER_EXITED, 0), st
    assert "from the volume" in Path(st.log_path).read_text()
    assert _snapshot(canary) == before


@pytest.mark.parametrize("handler", HANDLERS)
def test_symlinks_inside_the_image_keep_working(
    node: Node, hostile: dict[str, str], tmp_path: Path, handler: str
) -> None:
    """/var/run -> /run (absolute) and a relative /etc/resolv.conf link inside the image:
    the volume and the pod's resolv.conf are mounted where the links lead."""
    volume = tmp_path / "sa"
    volume.mkdir()
    (volume / "token").write_text("token-content\n")
    _pull(node, hostile["debian-like"])
    sid, pod = _pod(node, "debian", handler)
    cfg = node.container_config(
        "reader", ["sh", "-c", "cat /var/run/secrets/sa/token /run/secrets/sa/token "
                   "/etc/resolv.conf"])
    cfg.image.image = hostile["debian-like"]
    cfg.mounts.append(pb.Mount(container_path="/var/run/secrets/sa", host_path=str(volume),
                               readonly=True))
    cid = node.cri.runtime.CreateContainer(
        pb.CreateContainerRequest(pod_sandbox_id=sid, config=cfg, sandbox_config=pod)
    ).container_id
    node.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=cid))
    st = _wait_exited(node, cid)
    assert (st.exit_code, st.reason) == (0, "Completed"), Path(st.log_path).read_text()
    log = Path(st.log_path).read_text()
    assert log.count("token-content") == 2
    resolv = (node.tmp / "root" / "sandboxes" / sid / "resolv.conf").read_text()
    for line in resolv.splitlines():
        assert line in log


def test_hostile_pause_image_is_refused(node: Node, hostile: dict[str, str],
                                        canary: Path) -> None:
    """A configured pause image is an image like any other: /dev to a host dir is refused
    by RunPodSandbox, and the pod's steps are undone."""
    before = _snapshot(canary)
    cfg = node.proc.config
    cfg.write_text(f'pause_image = "{hostile["dev-to-host"]}"\n' + cfg.read_text())
    node.restart()
    with pytest.raises(grpc.RpcError) as e:
        node.run_pod("hostile-pause")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert "the image's /dev is a symlink" in (e.value.details() or "")
    assert _snapshot(canary) == before
    assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
    assert not list((node.tmp / "root" / "snapshots").glob("*"))
