"""A corpus of hostile images, one per attack, and a registry that serves any of them.

    img = hostile.build("symlink-then-write", canary_dir)   # a HostileImage
    reg = HostileRegistry(registry.addr)
    reg.start()
    ref = reg.push("evil", "symlink-then-write", img)       # pull `ref` to be attacked

`build(name, canary)` returns the layers (blobs as sent on the wire) and the
config (a dict, or raw bytes) of the attack `name`; attacks that aim at the
host aim at `canary`, a directory the test checks byte for byte afterwards.
`EXPECT[name]` is what a pull of it must give: the error class and a regex its
message must match, or None when the pull must succeed (a harmless image, or
one whose attack is on container creation: its own test says what must fail).
To add an attack: one entry in `_attacks` and one in `EXPECT`.
`make_canary` and `snapshot` give the canary and its byte-for-byte state;
`PLANTED` holds record changes an older pycri stored for such images.

Blobs and manifests go to the real registry; the few manifests it refuses to
store (annotations that are not strings, say) are served by the front itself,
as a hostile registry would: the front forwards everything else upstream.
"""

from __future__ import annotations

import hashlib
import http.client
import http.server
import io
import json
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pycri import errors
from tests.lib import images
from tests.lib.images import Entry
from tests.lib.registry import _FrontBase

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
# Bombs expand to this; tests run their managers with a smaller expansion bound.
BOMB_BYTES = 24 << 20


@dataclass
class HostileImage:
    layers: list[bytes]  # layer blobs, compressed as pushed
    config: dict[str, Any] | bytes  # JSON-encoded when a dict
    annotations: Any = None  # manifest annotations, sent as given when not None
    platform: Any = None  # when not None: the image is wrapped in an index with this platform
    layer_media_type: str = images.MEDIA["gzip"]
    extra: dict[str, Any] = field(default_factory=dict)  # merged into the manifest


def config_for(diff_ids: list[str], **inner: Any) -> dict[str, Any]:
    """A valid image config over `diff_ids`; `inner` goes into its "config" object."""
    return {"architecture": "amd64", "os": "linux",
            "config": {"Cmd": ["/bin/sh"], **inner},
            "rootfs": {"type": "layers", "diff_ids": diff_ids}}


def _image(entries: list[Entry], **kw: Any) -> HostileImage:
    raw = images.tar_bytes(entries)
    cfg = kw.pop("config", None) or config_for([images.sha(raw)])
    return HostileImage([images.compress(raw, "gzip")], cfg, **kw)


def _ok_layer() -> list[Entry]:
    return [images.directory("etc"), images.file("etc/hostname", "hostile\n")]


def _bomb(wrong_diff_id: bool) -> HostileImage:
    """A gzip layer of zeros: a few KiB on the wire, BOMB_BYTES unpacked."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo("zeros")
        ti.size, ti.mtime = BOMB_BYTES, images.MTIME
        tf.addfile(ti, io.BytesIO(bytes(BOMB_BYTES)))
    raw = buf.getvalue()
    diff = "sha256:" + "0" * 64 if wrong_diff_id else images.sha(raw)
    return HostileImage([images.compress(raw, "gzip")], config_for([diff]))


def _huge_pax() -> HostileImage:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo("x")
        ti.pax_headers = {"comment": "A" * (2 << 20)}
        tf.addfile(ti, io.BytesIO(b""))
    raw = buf.getvalue()
    return HostileImage([images.compress(raw, "gzip")], config_for([images.sha(raw)]))


def _header(name: str, kind: bytes = tarfile.REGTYPE, pax: dict[str, str] | None = None,
            fmt: int = tarfile.PAX_FORMAT, **fields: Any) -> HostileImage:
    """A layer whose one entry after an ordinary directory has header values past what
    the platform takes: set as TarInfo fields, or as raw pax records (which tarfile
    reads back into the fields: a uid of 2^40, an mtime of NaN)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        d = tarfile.TarInfo("etc")
        d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o755, images.MTIME
        tf.addfile(d)
        ti = tarfile.TarInfo(name)
        ti.type, ti.mode, ti.mtime = kind, 0o644, images.MTIME
        for k, v in fields.items():
            setattr(ti, k, v)
        ti.pax_headers = pax or {}
        tf.addfile(ti, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    raw = buf.getvalue()
    return HostileImage([images.compress(raw, "gzip")], config_for([images.sha(raw)]))


def _too_many_layers() -> HostileImage:
    """More layers than overlayfs can stack (one small blob, listed 600 times)."""
    raw = images.tar_bytes(_ok_layer())
    return HostileImage([images.compress(raw, "gzip")] * 600, config_for([images.sha(raw)] * 600))


def _with_config(**changes: Any) -> HostileImage:
    """The ok layer with its config changed: `config=None` drops a key, others replace."""
    raw = images.tar_bytes(_ok_layer())
    cfg = config_for([images.sha(raw)])
    for k, v in changes.items():
        cfg[k] = v
    return HostileImage([images.compress(raw, "gzip")], cfg)


def _attacks(canary: Path) -> dict[str, Callable[[], HostileImage]]:
    c = str(canary).lstrip("/")
    up = "../" * 12
    return {
        # Layer attacks, refused at unpack.
        "dotdot": lambda: _image([images.file(f"{up}{c}/pwned", "x")]),
        "absolute": lambda: _image([images.file(f"/{c}/pwned", "x")]),
        "symlink-then-write": lambda: _image(
            [images.symlink("esc", f"/{c}"), images.file("esc/pwned", "x")]),
        "relative-symlink-then-write": lambda: _image(
            [images.symlink("esc", f"{up}{c}"), images.file("esc/secret", "overwritten")]),
        "hardlink-outside": lambda: _image([images.hardlink("h", f"/{c}/secret")]),
        "hardlink-dotdot": lambda: _image([images.hardlink("h", f"{up}{c}/secret")]),
        "hardlink-through-symlink": lambda: _image(
            [images.symlink("esc", f"/{c}"), images.hardlink("h", "esc/secret")]),
        "overlay-xattr": lambda: _image(
            [Entry("d", tarfile.DIRTYPE, mode=0o755,
                   xattrs={"trusted.overlay.redirect": f"/{c}"})]),
        "malformed-whiteout": lambda: _image([images.file(".wh..", "")]),
        "huge-pax-header": _huge_pax,
        # Header values past what the kernel or the platform takes (issue 39, item 2).
        "name-component-too-long": lambda: _header("etc/" + "n" * 300),
        "path-too-long": lambda: _header("/".join(["etc", *["p" * 250] * 20])),
        "name-nul-byte": lambda: _header("etc/a", pax={"path": "etc/a\x00b"}),
        "symlink-target-too-long": lambda: _header("etc/l", tarfile.SYMTYPE,
                                                   linkname="t" * 5000),
        "symlink-target-empty": lambda: _header("etc/l", tarfile.SYMTYPE, linkname=""),
        "uid-huge": lambda: _header("etc/u", pax={"uid": str(1 << 40)}),
        "gid-negative": lambda: _header("etc/g", fmt=tarfile.GNU_FORMAT, gid=-5),
        "mtime-nan": lambda: _header("etc/t", pax={"mtime": "nan"}),
        "mtime-huge": lambda: _header("etc/t", pax={"mtime": "1e20"}),
        "xattr-name-nul": lambda: _header("etc/x", pax={"SCHILY.xattr.user.a\x00b": "v"}),
        "xattr-name-too-long": lambda: _header("etc/x", pax={
            "SCHILY.xattr.user." + "x" * 300: "v"}),
        "xattr-value-too-big": lambda: _header("etc/x", pax={
            "SCHILY.xattr.user.big": "v" * (70 << 10)}),
        "device-major-huge": lambda: _header("etc/d", tarfile.CHRTYPE, fmt=tarfile.GNU_FORMAT,
                                             devmajor=1 << 40, devminor=1),
        # A directory replaced by a symlink after its own entry: its mtime, set at the end
        # of the unpack, must not be set through the link (it pulls; the canary keeps its
        # times). Found by tests/image/test_fuzz_doors.py.
        "dir-replaced-by-symlink": lambda: _image(
            [images.directory("a"), images.directory("a/secret"), images.symlink("a", f"/{c}")]),
        # A device node in a layer is only a node inside the layer dir: it pulls.
        "device-node": lambda: _image(
            [Entry("null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3)]),
        # Decompression bombs and diff IDs.
        "gzip-bomb": lambda: _bomb(wrong_diff_id=False),
        "gzip-bomb-wrong-diff-id": lambda: _bomb(wrong_diff_id=True),
        "wrong-diff-id": lambda: _image(
            _ok_layer(), config=config_for(["sha256:" + "1" * 64])),
        # Image configs (issue 8, defects 2 and 15).
        "config-not-object": lambda: _with_config(config="x"),
        "user-uid-overflow": lambda: _with_config(
            config={"User": "99999999999999999999"}),
        "user-gid-overflow": lambda: _with_config(config={"User": "0:4294967295"}),
        "rootfs-list": lambda: _with_config(rootfs=[]),
        "diff-ids-not-digests": lambda: _with_config(
            rootfs={"type": "layers", "diff_ids": [1]}),
        "env-not-strings": lambda: _with_config(config={"Env": [1]}),
        "labels-not-strings": lambda: _with_config(config={"Labels": {"a": []}}),
        "config-too-big": lambda: _with_config(config={"Labels": {"a": "x" * (5 << 20)}}),
        "env-nul-byte": lambda: _with_config(config={"Env": ["A=b\x00c"]}),
        "cmd-nul-byte": lambda: _with_config(config={"Cmd": ["/bin/sh\x00-c"]}),
        "workdir-surrogate": lambda: _with_config(config={"WorkingDir": "/\udcff"}),
        "config-not-json": lambda: HostileImage(
            _with_config().layers, b"{not json"),
        "config-array": lambda: HostileImage(_with_config().layers, b"[]"),
        # Manifests.
        "annotations-not-strings": lambda: _image(_ok_layer(), annotations={"a": 1}),
        "annotations-not-object": lambda: _image(_ok_layer(), annotations="abc"),
        "annotations-huge": lambda: _image(_ok_layer(), annotations={"a": "x" * (200 << 10)}),
        "annotations-surrogate": lambda: _image(_ok_layer(), annotations={"a": "\ud800"}),
        "annotations-nul-byte": lambda: _image(_ok_layer(), annotations={"a\x00": "b"}),
        "layers-not-list": lambda: _image(_ok_layer(), extra={"layers": {"a": 1}}),
        "layer-size-negative": lambda: _image(_ok_layer(), extra={"layers": [
            {"mediaType": images.MEDIA["gzip"], "digest": "sha256:" + "2" * 64, "size": -1}]}),
        "config-descriptor-string": lambda: _image(_ok_layer(), extra={"config": "x"}),
        "too-many-layers": _too_many_layers,
        "index-platform-not-object": lambda: _image(_ok_layer(), platform="linux/amd64"),
    }


_CONFIG = (errors.InvalidArgument, r"image config")
EXPECT: dict[str, tuple[type[errors.PycriError], str] | None] = {
    "dotdot": (errors.InvalidArgument, r"'\.\.' refused"),
    "absolute": (errors.InvalidArgument, r"absolute path refused"),
    "symlink-then-write": (errors.InvalidArgument, r"goes through a symlink"),
    "relative-symlink-then-write": (errors.InvalidArgument, r"goes through a symlink"),
    "hardlink-outside": (errors.InvalidArgument, r"absolute path refused"),
    "hardlink-dotdot": (errors.InvalidArgument, r"'\.\.' refused"),
    "hardlink-through-symlink": (errors.InvalidArgument, r"goes through a symlink"),
    "overlay-xattr": (errors.InvalidArgument, r"overlay xattr"),
    "malformed-whiteout": (errors.InvalidArgument, r"malformed whiteout"),
    "huge-pax-header": (errors.InvalidArgument, r"extended tar header"),
    "device-node": None,
    "dir-replaced-by-symlink": None,
    "name-component-too-long": (errors.InvalidArgument, r"layer \w{64}: layer entry 'etc/n+"
                                r"\.\.\.: a name component of 300 bytes"),
    "path-too-long": (errors.InvalidArgument, r"layer entry 'etc/p+\.\.\.: a path of 5023 "),
    "name-nul-byte": (errors.InvalidArgument, r"a NUL byte in its name"),
    "symlink-target-too-long": (errors.InvalidArgument, r"'etc/l': a link target of 5000 by"),
    "symlink-target-empty": (errors.InvalidArgument, r"'etc/l': a link target of 0 bytes"),
    "uid-huge": (errors.InvalidArgument, r"'etc/u': uid 1099511627776 is out of range"),
    "gid-negative": (errors.InvalidArgument, r"'etc/g': gid -5 is out of range"),
    "mtime-nan": (errors.InvalidArgument, r"'etc/t': mtime nan is not a time"),
    "mtime-huge": (errors.InvalidArgument, r"'etc/t': mtime 1e\+20 is not a time"),
    "xattr-name-nul": (errors.InvalidArgument, r"'etc/x': an xattr name of 8 bytes"),
    "xattr-name-too-long": (errors.InvalidArgument, r"'etc/x': an xattr name of 305 bytes"),
    "xattr-value-too-big": (errors.InvalidArgument, r"'etc/x': an xattr value over 65536"),
    "device-major-huge": (errors.InvalidArgument, r"'etc/d': device 1099511627776:1 is out"),
    "gzip-bomb": (errors.InvalidArgument, r"unpacks to more than \d+ bytes"),
    "gzip-bomb-wrong-diff-id": (errors.InvalidArgument, r"unpacks to more than \d+ bytes"),
    "wrong-diff-id": (errors.InvalidArgument, r"hashes to sha256:\w+, config says"),
    "config-not-object": (errors.InvalidArgument, r"image config: 'config' must be an object"),
    "user-uid-overflow": (errors.InvalidArgument, r"'User' uid 9+ is out of range"),
    "user-gid-overflow": (errors.InvalidArgument, r"'User' gid 4294967295 is out of range"),
    "rootfs-list": (errors.InvalidArgument, r"image config: 'rootfs' must be an object"),
    "diff-ids-not-digests": (errors.InvalidArgument, r"'diff_ids' must be a list of sha256"),
    "env-not-strings": (errors.InvalidArgument, r"'Env' must be a list of strings"),
    "labels-not-strings": (errors.InvalidArgument, r"'Labels' must map strings to strings"),
    "config-too-big": (errors.InvalidArgument, r"image config of \d+ bytes \(limit 4194304\)"),
    "env-nul-byte": (errors.InvalidArgument, r"'Env' holds a NUL byte or invalid UTF-8"),
    "cmd-nul-byte": (errors.InvalidArgument, r"'Cmd' holds a NUL byte or invalid UTF-8"),
    "workdir-surrogate": (errors.InvalidArgument, r"'WorkingDir' holds a NUL byte or inv"),
    "annotations-surrogate": (errors.InvalidArgument, r"annotations hold a NUL byte or inv"),
    "annotations-nul-byte": (errors.InvalidArgument, r"annotations hold a NUL byte or inv"),
    "too-many-layers": (errors.InvalidArgument, r"600 layers \(overlayfs mounts at most"),
    "config-not-json": (errors.InvalidArgument, r"image config: not valid JSON"),
    "config-array": (errors.InvalidArgument, r"image config: not a JSON object"),
    "annotations-not-strings": (errors.InvalidArgument, r"'annotations' must map strings"),
    "annotations-not-object": (errors.InvalidArgument, r"'annotations' must map strings"),
    "annotations-huge": (errors.InvalidArgument, r"annotations of \d+ bytes \(pycri keeps"),
    "layers-not-list": (errors.InvalidArgument, r"'layers' must be a list"),
    "layer-size-negative": (errors.InvalidArgument, r"layer 0: 'size' must be a non-negative"),
    "config-descriptor-string": (errors.InvalidArgument, r"config: descriptor must be an obj"),
    "index-platform-not-object": (errors.InvalidArgument, r"'platform' must be an object"),
}
NAMES = sorted(EXPECT)


def make_canary(tmp_path: Path) -> Path:
    canary = tmp_path / "canary"
    canary.mkdir(mode=0o755)
    (canary / "secret").write_bytes(b"host secret\n")
    os.chmod(canary / "secret", 0o600)
    return canary


def snapshot(root: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every entry under `root` (and root itself): mode, size, mtime and content hash."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in ["", *dirs, *files]:
            p = Path(dirpath, name)
            st = os.lstat(p)
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
            out[str(p)] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


# What an older pycri stored for images it should have refused, or a damaged record.
PLANTED: dict[str, dict[str, Any]] = {
    "config-not-object": {"config": {"config": "x"}},
    "uid-overflow": {"config": {"config": {"User": "99999999999999999999"}}},
    "annotations-not-strings": {"annotations": {"a": 1}},
    "annotations-not-object": {"annotations": "abc"},
    "annotations-huge": {"annotations": {"a": "x" * (3800 << 10)}},
    "annotations-surrogate": {"annotations": {"a": "\ud800"}},
    "fields-wrong-types": {"config": "x", "size": "big", "repo_digests": None, "blobs": 7},
}
# The planted rows whose fields are not of their types: set aside at the next start
# (pycri/image/rows.py); the others are listed, so that they can be seen and removed.
MISTYPED = {"annotations-not-strings", "annotations-not-object", "annotations-surrogate",
            "fields-wrong-types"}


def build(name: str, canary: Path) -> HostileImage:
    """The hostile image `name`, its host-side attacks aimed at `canary`."""
    return _attacks(canary)[name]()


class HostileRegistry(_FrontBase):
    """A front on a real registry: pushes go upstream; manifests it refuses are served here."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self._served: dict[str, tuple[str, bytes]] = {}

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        got = self._served.get(h.path)
        if got is None:
            self.forward(h)
            return
        ctype, body = got
        h.send_response(200)
        h.send_header("Content-Type", ctype)
        h.send_header("Docker-Content-Digest", images.sha(body))
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _request(self, method: str, path: str, body: bytes = b"",
                 headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
        host, port = self.upstream.rsplit(":", 1)
        c = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.getheader("Location") or "", r.read()
        finally:
            c.close()

    def _blob(self, repo: str, data: bytes) -> dict[str, Any]:
        digest = images.sha(data)
        status, loc, body = self._request("POST", f"/v2/{repo}/blobs/uploads/")
        assert status == 202, body
        loc = loc.split(self.upstream, 1)[-1]
        sep = "&" if "?" in loc else "?"
        status, _, body = self._request("PUT", f"{loc}{sep}digest={digest}", data,
                                        {"Content-Type": "application/octet-stream"})
        assert status == 201, body
        return {"digest": digest, "size": len(data)}

    def _manifest(self, repo: str, ref: str, ctype: str, data: bytes) -> None:
        status, _, _ = self._request("PUT", f"/v2/{repo}/manifests/{ref}", data,
                                     {"Content-Type": ctype})
        if status != 201:  # the registry validates; a hostile one would not
            self._served[f"/v2/{repo}/manifests/{ref}"] = (ctype, data)
            self._served[f"/v2/{repo}/manifests/{images.sha(data)}"] = (ctype, data)

    def push(self, repo: str, tag: str, img: HostileImage) -> str:
        """Push `img` as `repo:tag`; returns the reference to pull it through this front."""
        cfg = img.config if isinstance(img.config, bytes) else json.dumps(img.config).encode()
        descs = {layer: self._blob(repo, layer) for layer in set(img.layers)}
        manifest: dict[str, Any] = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, **self._blob(repo, cfg)},
            "layers": [{"mediaType": img.layer_media_type, **descs[layer]}
                       for layer in img.layers],
            **img.extra,
        }
        if img.annotations is not None:
            manifest["annotations"] = img.annotations
        data = json.dumps(manifest).encode()
        if img.platform is None:
            self._manifest(repo, tag, OCI_MANIFEST, data)
        else:
            self._manifest(repo, images.sha(data), OCI_MANIFEST, data)
            index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
                {"mediaType": OCI_MANIFEST, "digest": images.sha(data), "size": len(data),
                 "platform": img.platform}]}
            self._manifest(repo, tag, OCI_INDEX, json.dumps(index).encode())
        return f"{self.addr}/{repo}:{tag}"
