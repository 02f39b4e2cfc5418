"""Untrusted OCI documents (index, manifest, image config), checked by type and range.

A pull is the only way an image document enters pycri, and everything later
(ListImages, ImageStatus, CreateContainer) reads what was stored. So every
field pycri uses is checked here, once, before anything is recorded: a wrong
type or an out-of-range value refuses the pull with InvalidArgument naming
the field, instead of an INTERNAL error on every later call that touches it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pycri import errors
from pycri.image import reference
from pycri.image.types import MAX_ID
from pycri.oci.spec.image import ImageConfig

# An image config is read whole, parsed and kept (in memory too) with the image record;
# 4 MiB as in containers/image, where real configs with long histories stay far below.
MAX_CONFIG = 4 << 20
# Manifest annotations are kept per image and sent in every ListImages answer, which
# the kubelet caps at 16 MiB; bounding each image keeps a thousand images under that.
MAX_ANNOTATIONS_BYTES = 16 << 10
# overlayfs stacks at most 500 lower dirs (OVL_MAX_STACK); a read-only view adds two.
MAX_LAYERS = 498


@dataclass(frozen=True)
class Descriptor:
    digest: str
    size: int
    media_type: str


@dataclass(frozen=True)
class Platform:
    os: str
    architecture: str
    variant: str


@dataclass(frozen=True)
class Manifest:
    config: Descriptor
    layers: list[Descriptor]
    annotations: dict[str, str]


def parse_json(data: bytes, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise errors.InvalidArgument(f"{what}: not valid JSON") from None
    if not isinstance(obj, dict):
        raise errors.InvalidArgument(f"{what}: not a JSON object")
    return obj


def _string(obj: Mapping[str, Any], key: str, what: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise errors.InvalidArgument(f"{what}: {key!r} must be a string")
    return value


def _object(obj: Mapping[str, Any], key: str, what: str) -> dict[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise errors.InvalidArgument(f"{what}: {key!r} must be an object")
    return value


def descriptor(d: Any, what: str) -> Descriptor:
    if not isinstance(d, dict):
        raise errors.InvalidArgument(f"{what}: descriptor must be an object")
    digest = d.get("digest")
    if not isinstance(digest, str) or not reference.is_digest(digest):
        raise errors.InvalidArgument(f"{what}: missing or unsupported digest (sha256 only)")
    size = d.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise errors.InvalidArgument(f"{what}: 'size' must be a non-negative integer")
    return Descriptor(digest, size, _string(d, "mediaType", what))


def is_text(value: str) -> bool:
    """True for text that can travel in a protobuf string and an argv: UTF-8, no NUL.
    JSON's \\u escapes can spell both a NUL and a lone surrogate, which UTF-8 cannot."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


def parse_annotations(value: Any, what: str) -> dict[str, str]:
    """String-to-string annotations within MAX_ANNOTATIONS_BYTES (refused over it: a
    subset would silently change what the image says about itself)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise errors.InvalidArgument(f"{what}: 'annotations' must map strings to strings")
    if not all(is_text(k) and is_text(v) for k, v in value.items()):
        raise errors.InvalidArgument(f"{what}: annotations hold a NUL byte or invalid UTF-8")
    total = sum(len(k.encode()) + len(v.encode()) for k, v in value.items())
    if total > MAX_ANNOTATIONS_BYTES:
        raise errors.InvalidArgument(
            f"{what}: annotations of {total} bytes (pycri keeps at most "
            f"{MAX_ANNOTATIONS_BYTES} per image)"
        )
    return dict(value)


def is_index(media_type: str, doc: Mapping[str, Any], index_types: tuple[str, ...]) -> bool:
    return media_type in index_types or "manifests" in doc


def index_entries(doc: Mapping[str, Any], what: str) -> list[tuple[Descriptor, Platform]]:
    """The index's manifests with their platforms (absent platform: empty strings)."""
    entries = doc.get("manifests")
    if not isinstance(entries, list):
        raise errors.InvalidArgument(f"{what}: 'manifests' must be a list")
    out = []
    for i, m in enumerate(entries):
        where = f"{what}: index entry {i}"
        d = descriptor(m, where)
        p = _object(m, "platform", where)
        out.append((d, Platform(_string(p, "os", where), _string(p, "architecture", where),
                                _string(p, "variant", where))))
    return out


def manifest(doc: Mapping[str, Any], what: str) -> Manifest:
    if doc.get("schemaVersion") != 2:
        raise errors.InvalidArgument(f"{what}: unsupported manifest (schema 1 or unknown)")
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise errors.InvalidArgument(f"{what}: 'layers' must be a list")
    config = descriptor(doc.get("config"), f"{what}: config")
    if config.size > MAX_CONFIG:
        raise errors.InvalidArgument(
            f"{what}: image config of {config.size} bytes (limit {MAX_CONFIG})"
        )
    if len(layers) > MAX_LAYERS:
        raise errors.InvalidArgument(
            f"{what}: {len(layers)} layers (overlayfs mounts at most {MAX_LAYERS})"
        )
    descs = [descriptor(d, f"{what}: layer {i}") for i, d in enumerate(layers)]
    for i, d in enumerate(descs):
        if "encrypted" in d.media_type:
            raise errors.InvalidArgument(f"{what}: layer {i}: encrypted layers are not supported")
    return Manifest(config, descs, parse_annotations(doc.get("annotations"), what))


def _check_id(text: str, kind: str, what: str) -> None:
    if text.isdigit() and int(text) > MAX_ID:
        raise errors.InvalidArgument(
            f"{what}: 'User' {kind} {text} is out of range (0-{MAX_ID})"
        )


def image_config(doc: Mapping[str, Any], what: str, layers: int) -> list[str]:
    """Check the config pycri will run containers from; returns its diff IDs."""
    for key in ("os", "architecture", "variant", "created", "author"):
        _string(doc, key, what)
    if doc.get("config") is not None and not isinstance(doc.get("config"), dict):
        raise errors.InvalidArgument(f"{what}: 'config' must be an object")
    try:  # what containers are made of
        inner = ImageConfig.from_oci({"config": doc.get("config")})
    except errors.InvalidArgument as e:  # named after the image, as every other refusal
        raise errors.InvalidArgument(f"{what}: {str(e).removeprefix('image config: ')}") from None
    strings = {"Entrypoint": inner.entrypoint, "Cmd": inner.cmd, "Env": inner.env,
               "WorkingDir": (inner.working_dir,), "User": (inner.user,),
               "StopSignal": (inner.stop_signal,),
               "Labels": (*inner.labels, *inner.labels.values())}
    for key, values in strings.items():
        if not all(map(is_text, values)):
            raise errors.InvalidArgument(f"{what}: {key!r} holds a NUL byte or invalid UTF-8")
    name, _, group = inner.user.partition(":")
    _check_id(name, "uid", what)
    _check_id(group, "gid", what)
    rootfs = _object(doc, "rootfs", what)
    if _string(rootfs, "type", f"{what}: rootfs") not in ("", "layers"):
        raise errors.InvalidArgument(f"{what}: rootfs 'type' must be \"layers\"")
    diff_ids = rootfs.get("diff_ids") or []
    if not isinstance(diff_ids, list) or not all(
        isinstance(d, str) and reference.is_digest(d) for d in diff_ids
    ):
        raise errors.InvalidArgument(f"{what}: rootfs 'diff_ids' must be a list of sha256 digests")
    if len(diff_ids) != layers:
        raise errors.InvalidArgument(
            f"{what}: {len(diff_ids)} diff_ids for {layers} layers in the manifest"
        )
    return diff_ids
