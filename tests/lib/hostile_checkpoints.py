"""A corpus of hostile checkpoint layouts, one per attack, for CreateContainer from an
archive or from an image holding one.

    entries = hostile_checkpoints.build("json-deep", busybox_ref, work_dir)
    # as an archive's members: images.tar_bytes(entries); as an image's layer: [entries]

`EXPECT[name]` is the gRPC code CreateContainer must answer (with the request of
`tests/e2e/test_checkpoint.py::confined`: uid 1000, no capability, RuntimeDefault);
whatever the code, nothing may change. The CRIU images are made by CRIU's own `crit`
(tests/lib/criu_images.py). To add an attack: one entry in `_attacks` and one in `EXPECT`.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from pycri.oci.spec.capabilities import ALL_CAPABILITIES
from tests.lib import images
from tests.lib.criu_images import ALLOW_ALL, DENY_ALL, write_core, write_seccomp
from tests.lib.images import Entry

INVALID = grpc.StatusCode.INVALID_ARGUMENT
DENIED = grpc.StatusCode.FAILED_PRECONDITION


def container_json(image: str, **config: Any) -> bytes:
    """A well-formed pycri.container.json for `image`; `config` overrides its keys."""
    doc = {"metadata": {"name": "evil"}, "image": {"image": image},
           "command": ["sleep", "3600"], **config}
    return json.dumps({"version": 1, "config": doc, "image_id": ""}).encode()


def _tar(*entries: Entry) -> bytes:
    return images.tar_bytes(list(entries))


def _raw_tar(name: str, data: bytes) -> bytes:
    """A tar with one member `name` as given (images.tar_bytes normalises names)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _attacks(image: str, work: Path) -> dict[str, Callable[[], list[Entry]]]:
    def core(name: str, **kw: Any) -> Entry:
        path = write_core(work / name, **kw)
        return images.file(f"checkpoint/{path.name}", path.read_bytes())

    def seccomp(name: str, programs: list[bytes], **kw: Any) -> list[Entry]:
        """A core under filter 0 of a seccomp.img holding `programs`."""
        path = write_seccomp(work / name, programs, **kw)
        return [core(name, pid=5, uid=1000),
                images.file(f"checkpoint/{path.name}", path.read_bytes())]

    def ok_core() -> Entry:
        return core("granted", uid=1000)

    def ok_filters() -> Entry:
        return images.file("checkpoint/seccomp.img", (work / "granted/seccomp.img").read_bytes())

    ok_json = images.file("pycri.container.json", container_json(image))

    def layout(*extra: Entry, doc: Entry | None = None, process: bool = True) -> list[Entry]:
        return [doc or ok_json, images.directory("checkpoint"),
                *([ok_core(), ok_filters()] if process else []), *extra]

    def metadata(data: bytes | str) -> list[Entry]:
        return layout(doc=images.file("pycri.container.json", data))

    return {
        "no-metadata": lambda: layout()[1:],
        "metadata-not-json": lambda: metadata(b"\xff{not json"),
        "metadata-deep": lambda: metadata("[" * 100_000 + "]" * 100_000),
        "metadata-too-big": lambda: metadata(b" " * ((16 << 20) + 1) + b"{}"),
        "metadata-not-object": lambda: metadata("[]"),
        "metadata-wrong-version": lambda: metadata('{"version": 99}'),
        "metadata-wrong-types": lambda: metadata(
            '{"version": 1, "config": {"metadata": 5, "image": []}}'),
        "metadata-no-image": lambda: metadata('{"version": 1, "config": {}}'),
        "metadata-a-directory": lambda: layout(doc=images.directory("pycri.container.json")),
        "no-checkpoint-dir": lambda: [ok_json],
        "no-process": lambda: layout(process=False),
        "core-garbage": lambda: layout(images.file("checkpoint/core-2.img", b"\x00" * 64)),
        "core-truncated": lambda: layout(images.file(
            "checkpoint/core-3.img", ok_core().data[:20])),
        "core-privileged": lambda: layout(core("root", pid=4, uid=0, caps=ALL_CAPABILITIES,
                                                seccomp="disabled")),
        "claims-host-root": lambda: layout(doc=images.file("pycri.container.json", container_json(
            image, mounts=[{"containerPath": "/host", "hostPath": "/"}]))),
        "claims-device": lambda: layout(doc=images.file("pycri.container.json", container_json(
            image, devices=[{"containerPath": "/dev/sda", "hostPath": "/dev/sda"}]))),
        "deep-dirs": lambda: layout(images.file("/".join(["d"] * 20) + "/f", "x")),
        "link-out": lambda: layout(images.symlink("checkpoint/pages-1.img", "/etc/shadow")),
        "rootfs-diff-escape": lambda: layout(images.file(
            "rootfs-diff.tar", _raw_tar("../../../../../../tmp/pycri-escape", b"x"))),
        "rootfs-diff-not-tar": lambda: layout(images.file("rootfs-diff.tar", b"junk" * 200)),
        "deleted-escape": lambda: layout(images.file(
            "deleted.files", json.dumps(["/../../../../etc/hostname"]))),
        "deleted-not-list": lambda: layout(images.file("deleted.files", '{"a": 1}')),
        # issue 39, item 5: a filter letting everything through, a loop of filters
        "seccomp-allow-all": lambda: layout(*seccomp("allow-all", [ALLOW_ALL]),
                                                    process=False),
        "seccomp-loop": lambda: layout(*seccomp("loop", [DENY_ALL], prevs=[0]),
                                               process=False),
    }


EXPECT: dict[str, grpc.StatusCode] = {
    "no-metadata": INVALID,
    "metadata-not-json": INVALID,
    "metadata-deep": INVALID,
    "metadata-too-big": INVALID,
    "metadata-not-object": INVALID,
    "metadata-wrong-version": INVALID,
    "metadata-wrong-types": INVALID,
    "metadata-no-image": INVALID,
    "metadata-a-directory": INVALID,
    "no-checkpoint-dir": INVALID,
    "no-process": INVALID,
    "core-garbage": INVALID,
    "core-truncated": INVALID,
    "core-privileged": DENIED,
    "claims-host-root": DENIED,
    "claims-device": DENIED,
    "deep-dirs": INVALID,
    "link-out": INVALID,
    "rootfs-diff-escape": INVALID,
    "rootfs-diff-not-tar": INVALID,
    "deleted-escape": INVALID,
    "deleted-not-list": INVALID,
    "seccomp-allow-all": DENIED,
    "seccomp-loop": INVALID,
}
NAMES = sorted(EXPECT)


def build(name: str, image: str, work: Path) -> list[Entry]:
    """The layout of attack `name` on a container of `image`; `work`: a scratch dir."""
    return _attacks(image, work)[name]()
