"""The ImageService over real gRPC on a unix socket, servicer registered alone."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc
from tests.image.conftest import Maker, serve


@pytest.fixture
async def stub(make_manager: Maker, tmp_path: Path) -> AsyncIterator[api_pb2_grpc.ImageServiceStub]:
    async with serve(make_manager(), tmp_path / "img.sock") as s:
        yield s


def spec(ref: str) -> pb.ImageSpec:
    return pb.ImageSpec(image=ref)


async def test_rpcs(stub: api_pb2_grpc.ImageServiceStub, refs: dict[str, str]) -> None:
    r = await stub.ImageStatus(pb.ImageStatusRequest(image=spec(refs["uid"])))
    assert not r.HasField("image")  # unknown: unset, not an error
    iid = (await stub.PullImage(pb.PullImageRequest(image=spec(refs["uid"])))).image_ref
    named = (await stub.PullImage(pb.PullImageRequest(image=spec(refs["username"])))).image_ref
    r = await stub.ImageStatus(pb.ImageStatusRequest(image=spec(refs["uid"]), verbose=True))
    assert r.image.id == iid and list(r.image.repo_tags) == [refs["uid"]]
    assert r.image.HasField("uid") and r.image.uid.value == 1000 and r.image.username == ""
    assert r.image.size > 0 and r.image.repo_digests[0].split("@")[1].startswith("sha256:")
    assert json.loads(r.info["info"])["imageSpec"]["config"]["User"] == "1000"
    r = await stub.ImageStatus(pb.ImageStatusRequest(image=spec(named)))
    assert not r.image.HasField("uid") and r.image.username == "user1"
    lst = await stub.ListImages(pb.ListImagesRequest())
    assert sorted(i.id for i in lst.images) == sorted({iid, named})
    lst = await stub.ListImages(pb.ListImagesRequest(filter=pb.ImageFilter(image=spec(iid))))
    assert [i.id for i in lst.images] == [iid]
    fs = await stub.ImageFsInfo(pb.ImageFsInfoRequest())
    (u,) = fs.image_filesystems
    assert u.used_bytes.value > 0 and u.inodes_used.value > 0 and u.timestamp > 0
    assert u.fs_id.mountpoint and fs.container_filesystems[0].fs_id.mountpoint
    await stub.RemoveImage(pb.RemoveImageRequest(image=spec(refs["uid"])))
    await stub.RemoveImage(pb.RemoveImageRequest(image=spec(refs["uid"])))  # absent: ok
    r = await stub.ImageStatus(pb.ImageStatusRequest(image=spec(iid)))
    assert not r.HasField("image")


async def test_errors(stub: api_pb2_grpc.ImageServiceStub, refs: dict[str, str]) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.PullImage(pb.PullImageRequest(image=spec("Not/Valid")))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.PullImage(pb.PullImageRequest(image=spec(refs["busybox"] + "-nope")))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.PullImage(pb.PullImageRequest(image=spec("")))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.PullImage(pb.PullImageRequest(
            image=spec(refs["busybox"]), auth=pb.AuthConfig(auth="%%%")))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
