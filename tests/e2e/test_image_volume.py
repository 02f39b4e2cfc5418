"""Image volumes (CRI Mount.image) end to end: a pulled image mounted read-only into a
container, whole or a sub path, reported in ContainerStatus and gone with the container."""

from __future__ import annotations

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e

SLEEP = ["sleep", "1000"]


def image_id(node: Node) -> str:
    return node.cri.image.ImageStatus(
        pb.ImageStatusRequest(image=pb.ImageSpec(image=node.image))).image.id


def volume(path: str, image: str, sub_path: str = "", readonly: bool = True) -> pb.Mount:
    return pb.Mount(container_path=path, readonly=readonly, image=pb.ImageSpec(image=image),
                    image_sub_path=sub_path)


def snapshots_mounted(node: Node) -> list[str]:
    with open("/proc/mounts") as f:
        return [line.split()[1] for line in f
                if line.split()[1].startswith(str(node.tmp / "root" / "snapshots"))]


def test_image_volume_read_only_sub_path_status_and_removal(node: Node) -> None:
    iid = image_id(node)
    sid, cfg = node.run_pod("imgvol")
    cid = node.run(sid, cfg, "vol", SLEEP, mounts=[
        volume("/mnt/img", iid),
        volume("/mnt/etc", node.image, sub_path="etc"),  # by tag works as well
    ])
    ok = node.exec(cid, "ls", "/mnt/img/bin/sh")
    assert ok.exit_code == 0, ok.stderr
    denied = node.exec(cid, "touch", "/mnt/img/new")
    assert denied.exit_code != 0 and b"Read-only file system" in denied.stderr
    runs = node.exec(cid, "/mnt/img/bin/ls", "/mnt/img/data")  # not noexec
    assert (runs.exit_code, runs.stdout) == (0, b"new\n")
    motd = node.exec(cid, "cat", "/mnt/etc/motd")
    assert motd.stdout == b"pycri test image\n"
    assert node.exec(cid, "ls", "/mnt/etc/etc").exit_code != 0  # only the sub path
    mounts = {m.container_path: m for m in node.status(cid).mounts}
    assert mounts["/mnt/img"].image.image == iid and mounts["/mnt/img"].image.image_ref == iid
    assert mounts["/mnt/etc"].image.image_ref == iid
    assert mounts["/mnt/etc"].image_sub_path == "etc" and mounts["/mnt/etc"].readonly
    assert len(snapshots_mounted(node)) == 3  # the rootfs and two views

    # RemoveImage while the volume is mounted: the image goes, the volume keeps working.
    node.cri.image.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=iid)))
    assert not node.cri.image.ListImages(pb.ListImagesRequest()).images
    assert node.exec(cid, "cat", "/mnt/img/etc/motd").stdout == b"pycri test image\n"

    # After a restart the container still finds its views to release them.
    node.restart()
    assert node.status(cid).mounts[0].image.image_ref == iid
    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0))
    node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
    assert snapshots_mounted(node) == []
    assert list((node.tmp / "root" / "snapshots").iterdir()) == []
    assert list((node.tmp / "root" / "layers").iterdir()) == []  # the image's layers went too
    node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=node.image)))


def test_image_volume_bad_requests(node: Node) -> None:
    iid = image_id(node)
    sid, cfg = node.run_pod("imgvol-bad")
    cases: list[tuple[pb.Mount, grpc.StatusCode, str]] = [
        (volume("/v", iid, readonly=False), grpc.StatusCode.INVALID_ARGUMENT, "read-only"),
        (pb.Mount(container_path="/v", host_path="/tmp", readonly=True,
                  image=pb.ImageSpec(image=iid)),
         grpc.StatusCode.INVALID_ARGUMENT, "mutually exclusive"),
        (volume("/v", "sha256:" + "0" * 64), grpc.StatusCode.NOT_FOUND, "pull it first"),
        (volume("/v", iid, sub_path="not-existing"), grpc.StatusCode.INVALID_ARGUMENT,
         "does not exist"),
        (volume("/v", iid, sub_path="../etc"), grpc.StatusCode.INVALID_ARGUMENT, "'..'"),
        (volume("/v", iid, sub_path="/etc"), grpc.StatusCode.INVALID_ARGUMENT, "relative"),
    ]
    for mount, code, message in cases:
        # A valid image volume first, so a failure has a view of its own to undo.
        ok = volume("/ok", iid)
        with pytest.raises(grpc.RpcError) as e:
            node.create(sid, cfg, "bad", SLEEP, mounts=[ok, mount])
        assert e.value.code() == code, e.value.details()
        assert message in (e.value.details() or ""), e.value.details()
    assert not node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers
    assert snapshots_mounted(node) == []
    assert list((node.tmp / "root" / "snapshots").iterdir()) == []
