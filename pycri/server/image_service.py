"""CRI ImageService: translate CRI messages to ImageManager calls and back, nothing more."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
from google.protobuf.message import Message

from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc
from pycri.config import ListsConfig
from pycri.errors import InvalidArgument
from pycri.image.auth import Auth, Secret
from pycri.image.manager import ImageManager
from pycri.image.types import FsUsage, Image
from pycri.server.errors import rpc
from pycri.server.streamed import streamed_list


def _image(img: Image) -> pb.Image:
    out = pb.Image(
        id=img.id, repo_tags=img.repo_tags, repo_digests=img.repo_digests, size=img.size,
        username=img.username, pinned=img.pinned,
        spec=pb.ImageSpec(image=img.id, annotations=img.annotations),
    )
    if img.uid is not None:
        out.uid.value = img.uid
    return out


def _status(img: Image | None) -> pb.ImageStatusResponse:
    return pb.ImageStatusResponse() if img is None else pb.ImageStatusResponse(image=_image(img))


def _fs(u: FsUsage) -> pb.FilesystemUsage:
    return pb.FilesystemUsage(
        timestamp=u.timestamp_ns,
        fs_id=pb.FilesystemIdentifier(mountpoint=u.mountpoint),
        used_bytes=pb.UInt64Value(value=u.used_bytes),
        inodes_used=pb.UInt64Value(value=u.inodes_used),
    )


def _auth(a: pb.AuthConfig) -> Auth | None:
    auth = Auth(
        username=a.username, password=Secret(a.password), auth=Secret(a.auth),
        server_address=a.server_address, identity_token=Secret(a.identity_token),
        registry_token=Secret(a.registry_token),
    )
    return auth if auth != Auth() else None


def _ref(spec: pb.ImageSpec) -> str:
    if not spec.image:
        raise InvalidArgument("image reference must be set")
    return spec.image


# Encoded answers kept per image generation; requests name any refs they like.
MAX_ENCODED = 1024


class ImageServicer(api_pb2_grpc.ImageServiceServicer):
    """ListImages and ImageStatus answer with bytes encoded once per image generation
    (ImageManager.generation, bumped by every pull, removal and pinning change)."""

    def __init__(self, manager: ImageManager, list_chunks: ListsConfig | None = None) -> None:
        self.m = manager
        self.list_chunks = list_chunks or ListsConfig()
        self._encoded: dict[tuple[str, str], bytes] = {}  # (rpc, ref) -> answer
        self._generation = -1  # of the answers in _encoded

    def _answer(self, rpc: str, ref: str, build: Callable[[], Message]) -> bytes:
        if self._generation != self.m.generation:
            self._encoded.clear()
            self._generation = self.m.generation
        answer = self._encoded.get((rpc, ref))
        if answer is None:
            answer = build().SerializeToString()
            if len(self._encoded) < MAX_ENCODED:
                self._encoded[rpc, ref] = answer
        return answer

    @rpc
    async def ListImages(
        self, request: pb.ListImagesRequest, context: grpc.aio.ServicerContext
    ) -> bytes:
        ref = request.filter.image.image if request.HasField("filter") else ""
        return self._answer("ListImages", ref, lambda: pb.ListImagesResponse(
            images=[_image(i) for i in self.m.list(ref or None)]))

    StreamImages = streamed_list(
        "StreamImages", ListImages, pb.ListImagesRequest, "images", pb.StreamImagesResponse,
        "images", unary_response=pb.ListImagesResponse,
    )

    @rpc
    async def ImageStatus(
        self, request: pb.ImageStatusRequest, context: grpc.aio.ServicerContext
    ) -> bytes | pb.ImageStatusResponse:
        ref = _ref(request.image)
        if not request.verbose:
            return self._answer("ImageStatus", ref, lambda: _status(self.m.status(ref)))
        img = self.m.status(ref)
        if img is None:
            return pb.ImageStatusResponse()
        info = json.dumps({"imageSpec": img.config, "repoTags": img.repo_tags,
                           "repoDigests": img.repo_digests})
        return pb.ImageStatusResponse(image=_image(img), info={"info": info})

    @rpc
    async def PullImage(
        self, request: pb.PullImageRequest, context: grpc.aio.ServicerContext
    ) -> pb.PullImageResponse:
        auth = _auth(request.auth) if request.HasField("auth") else None
        return pb.PullImageResponse(image_ref=await self.m.pull(_ref(request.image), auth))

    @rpc
    async def RemoveImage(
        self, request: pb.RemoveImageRequest, context: grpc.aio.ServicerContext
    ) -> pb.RemoveImageResponse:
        await self.m.remove(_ref(request.image))
        return pb.RemoveImageResponse()

    @rpc
    async def ImageFsInfo(
        self, request: pb.ImageFsInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ImageFsInfoResponse:
        return pb.ImageFsInfoResponse(
            image_filesystems=[_fs(self.m.fs_info())],
            container_filesystems=[_fs(await self.m.container_fs_info())],
        )
