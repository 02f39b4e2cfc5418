"""What a registry and its token service send besides blobs is read at one door
(pycri/image/answers.py, issue 39): bounded while reading, decoded with a depth bound
into typed values, and every failure a domain error naming the registry and the reason,
never the body, never INTERNAL or UNKNOWN. Before, a token answer that was a JSON list,
a string, a number or null was INTERNAL AttributeError, a deeply nested one INTERNAL
RecursionError, and one of 256 MiB was read whole (1.7 GB of RSS)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.image.conftest import Maker, serve
from tests.lib.registry import AnswerFront, RedirectFront, Registry

UNUSABLE = {
    "list": b"[1, 2]",
    "string": b'"token"',
    "number": b"5",
    "null": b"null",
    "nested": b'{"token": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "not-json": b"\xff\xfe{token",
    "no-token": b'{"expires_in": 60}',
    "token-not-text": b'{"token": {"a": 1}}',
    "header-split": json.dumps({"token": "a\r\nX-Injected: 1"}).encode(),
    "token-huge": json.dumps({"token": "t" * (70 << 10)}).encode(),
}


async def _pull_code(m: Maker, front: AnswerFront, tmp_path: Path) -> tuple[grpc.StatusCode,
                                                                               str]:
    manager = m()
    async with serve(manager, tmp_path / "s.sock") as stub:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.PullImage(pb.PullImageRequest(
                image=pb.ImageSpec(image=f"{front.addr}/busybox:latest")))
    assert not manager.list()
    return e.value.code(), e.value.details() or ""


@pytest.mark.parametrize("name", list(UNUSABLE))
async def test_an_unusable_token_answer_is_unavailable_naming_the_registry(
        make_manager: Maker, registry: Registry, tmp_path: Path, name: str) -> None:
    front = AnswerFront(registry.addr, UNUSABLE[name])
    front.start()
    try:
        code, details = await _pull_code(make_manager, front, tmp_path)
    finally:
        front.stop()
    assert code == grpc.StatusCode.UNAVAILABLE, details
    assert details.startswith(f"{front.addr}/busybox: the token service's answer "), details
    assert "Injected" not in details and "ttttt" not in details


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "chunked"])
async def test_a_huge_token_answer_is_refused_at_its_bound(
        make_manager: Maker, registry: Registry, tmp_path: Path, length: bool) -> None:
    front = AnswerFront(registry.addr, b'{"token": "' + b"x" * 1000, size=256 << 20,
                        length=length)
    front.start()
    try:
        code, details = await _pull_code(make_manager, front, tmp_path)
    finally:
        front.stop()
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "token service: larger than 1048576 bytes" in details
    # Refused unread with an honest length; otherwise read to the bound, and what the
    # socket buffers took besides (a few MiB on loopback), never the 256 MiB.
    assert front.sent < (16 << 20), front.sent


@pytest.mark.parametrize(("status", "code"), [
    (401, grpc.StatusCode.PERMISSION_DENIED), (403, grpc.StatusCode.PERMISSION_DENIED),
    (429, grpc.StatusCode.UNAVAILABLE), (503, grpc.StatusCode.UNAVAILABLE),
    (400, grpc.StatusCode.FAILED_PRECONDITION), (418, grpc.StatusCode.FAILED_PRECONDITION),
])
async def test_a_refusal_has_its_code_and_the_specs_error_codes_only(
        make_manager: Maker, registry: Registry, tmp_path: Path, status: int,
        code: grpc.StatusCode) -> None:
    body = json.dumps({"errors": [{"code": "DENIED", "message": "free text SECRET"},
                                  {"code": "NOT-A-SPEC-CODE"}, "junk"]}).encode()
    front = AnswerFront(registry.addr, body, status=status)
    front.start()
    try:
        got, details = await _pull_code(make_manager, front, tmp_path)
    finally:
        front.stop()
    assert got == code, details
    assert details.endswith(f"registry answered {status} (DENIED)") or details.endswith(
        f"access denied ({status}) (DENIED)"), details
    assert "SECRET" not in details and "NOT-A-SPEC" not in details


async def test_a_huge_error_body_is_read_to_its_bound_only(
        make_manager: Maker, registry: Registry, tmp_path: Path) -> None:
    front = AnswerFront(registry.addr, b'{"errors": [', size=256 << 20, length=False,
                        status=503)
    front.start()
    try:
        code, details = await _pull_code(make_manager, front, tmp_path)
    finally:
        front.stop()
    assert code == grpc.StatusCode.UNAVAILABLE and details.endswith("registry answered 503")
    assert front.sent < (16 << 20), front.sent


@pytest.mark.parametrize(("location", "code"), [
    ("ftp://127.0.0.1/v2/busybox/manifests/latest", grpc.StatusCode.FAILED_PRECONDITION),
    ("file:///etc/shadow", grpc.StatusCode.FAILED_PRECONDITION),
    ("http://alice:SECRET@{self}/v2/busybox/manifests/x", grpc.StatusCode.FAILED_PRECONDITION),
    ("http://{self}/" + "a" * 9000, grpc.StatusCode.FAILED_PRECONDITION),
    ("http://{self}/v2/busybox/manifests/latest", grpc.StatusCode.UNAVAILABLE),  # a loop
], ids=["ftp", "file", "userinfo", "huge", "loop"])
async def test_a_redirect_pycri_does_not_follow_is_refused(
        make_manager: Maker, registry: Registry, tmp_path: Path, location: str,
        code: grpc.StatusCode) -> None:
    """Redirect targets come through the door too (answers.check_redirect): http or
    https, no userinfo, at most 8 KiB, five hops at most."""
    front = RedirectFront(registry.addr, "", location=location)
    front.start()
    try:
        manager = make_manager()
        async with serve(manager, tmp_path / "s.sock") as stub:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.PullImage(pb.PullImageRequest(
                    image=pb.ImageSpec(image=f"{front.addr}/busybox:latest")))
    finally:
        front.stop()
    assert e.value.code() == code, e.value.details()
    assert "SECRET" not in (e.value.details() or "") and "aaaaaaaa" not in (
        e.value.details() or "")
    assert len([p for p in front.requests if "/manifests/" in p]) <= 6
