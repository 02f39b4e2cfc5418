"""Build OCI image layouts from the host's static busybox and push them with skopeo.

Everything is deterministic (fixed mtimes, ordered entries, gzip mtime 0), so
the same inputs give the same digests. Typical use:

    reg = Registry(tmp); reg.start()
    ref = push_busybox(reg, tmp)          # "127.0.0.1:PORT/busybox:latest"

The busybox rootfs has /bin/busybox with every applet as a symlink next to
it (/bin/sh, /bin/sleep, ...), /etc/passwd and /etc/group with a few users
(root 0, daemon 1, nobody 65534, user1 1000, user2 1001), /tmp, /root, and
from the later layers /etc/removed whited out and /data an opaque directory.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

BUSYBOX = Path("/usr/bin/busybox")
MTIME = 1_600_000_000
PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    "daemon:x:1:1:daemon:/usr/sbin:/bin/false\n"
    "user1:x:1000:1000:user1:/home/user1:/bin/sh\n"
    "user2:x:1001:1001:user2:/home/user2:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
)
GROUP = (
    "root:x:0:\ndaemon:x:1:\nuser1:x:1000:\nuser2:x:1001:\n"
    "extra:x:2000:user1,user2\nnogroup:x:65534:\n"
)
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA = {
    "gzip": OCI_LAYER + "+gzip",
    "zstd": OCI_LAYER + "+zstd",
    "none": OCI_LAYER,
}


@dataclass
class Entry:
    """One tar entry; `kind` is a tarfile type (REGTYPE, DIRTYPE, SYMTYPE, LNKTYPE, CHRTYPE)."""

    name: str
    kind: bytes = tarfile.REGTYPE
    data: bytes = b""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    linkname: str = ""
    xattrs: dict[str, str] = field(default_factory=dict)
    devmajor: int = 0
    devminor: int = 0


def file(name: str, data: bytes | str, mode: int = 0o644, uid: int = 0, gid: int = 0) -> Entry:
    raw = data.encode() if isinstance(data, str) else data
    return Entry(name, tarfile.REGTYPE, raw, mode, uid, gid)


def directory(name: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> Entry:
    return Entry(name, tarfile.DIRTYPE, mode=mode, uid=uid, gid=gid)


def symlink(name: str, target: str) -> Entry:
    return Entry(name, tarfile.SYMTYPE, mode=0o777, linkname=target)


def hardlink(name: str, target: str) -> Entry:
    return Entry(name, tarfile.LNKTYPE, linkname=target)


def whiteout(path: str) -> Entry:
    """OCI whiteout: hides `path` of the layers below."""
    d, _, base = path.rstrip("/").rpartition("/")
    return file(f"{d}/.wh.{base}" if d else f".wh.{base}", b"")


def opaque(dirpath: str) -> Entry:
    """OCI opaque marker: `dirpath` shows only this layer's entries."""
    return file(f"{dirpath.rstrip('/')}/.wh..wh..opq", b"")


def tar_bytes(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            ti = tarfile.TarInfo(e.name)
            ti.type, ti.mode, ti.uid, ti.gid = e.kind, e.mode, e.uid, e.gid
            ti.mtime, ti.linkname, ti.size = MTIME, e.linkname, len(e.data)
            ti.devmajor, ti.devminor = e.devmajor, e.devminor
            ti.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in e.xattrs.items()}
            tf.addfile(ti, io.BytesIO(e.data) if e.kind == tarfile.REGTYPE else None)
    return buf.getvalue()


def compress(raw: bytes, compression: str) -> bytes:
    if compression == "gzip":
        return gzip.compress(raw, compresslevel=6, mtime=0)
    if compression == "zstd":
        return zstandard.ZstdCompressor(level=3).compress(raw)
    return raw


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class ImageSpec:
    layers: list[list[Entry]]
    user: str = ""
    env: list[str] = field(default_factory=lambda: ["PATH=/bin:/usr/bin:/sbin:/usr/sbin"])
    entrypoint: list[str] | None = None
    cmd: list[str] = field(default_factory=lambda: ["/bin/sh"])
    working_dir: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    compression: str = "gzip"  # for every layer; or a list in `compressions`
    compressions: list[str] | None = None
    architecture: str = "amd64"
    variant: str = ""
    annotations: dict[str, str] = field(default_factory=dict)


def _blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = sha(data)
    p = layout / "blobs" / "sha256" / digest.split(":")[1]
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return digest, len(data)


def _canon(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_manifest(layout: Path, spec: ImageSpec) -> dict[str, Any]:
    """Write one image's blobs; returns its manifest descriptor (with platform)."""
    comps = spec.compressions or [spec.compression] * len(spec.layers)
    layer_descs, diff_ids = [], []
    for entries, comp in zip(spec.layers, comps, strict=True):
        raw = tar_bytes(entries)
        diff_ids.append(sha(raw))
        digest, size = _blob(layout, compress(raw, comp))
        layer_descs.append({"mediaType": MEDIA[comp], "digest": digest, "size": size})
    cfg: dict[str, Any] = {
        "architecture": spec.architecture, "os": "linux",
        "config": {"User": spec.user, "Env": spec.env, "Cmd": spec.cmd,
                   "WorkingDir": spec.working_dir, "Labels": spec.labels},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "created": "2020-09-13T12:26:40Z",
    }
    if spec.entrypoint is not None:
        cfg["config"]["Entrypoint"] = spec.entrypoint
    if spec.variant:
        cfg["variant"] = spec.variant
    cdigest, csize = _blob(layout, _canon(cfg))
    manifest: dict[str, Any] = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": cdigest, "size": csize},
        "layers": layer_descs,
    }
    if spec.annotations:
        manifest["annotations"] = spec.annotations
    mdigest, msize = _blob(layout, _canon(manifest))
    platform = {"os": "linux", "architecture": spec.architecture}
    if spec.variant:
        platform["variant"] = spec.variant
    return {"mediaType": manifest["mediaType"], "digest": mdigest, "size": msize,
            "platform": platform}


def write_layout(layout: Path, tag: str, specs: list[ImageSpec]) -> str:
    """OCI layout with `tag` naming one image, or an OCI index of several; returns its digest."""
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    descs = [write_manifest(layout, s) for s in specs]
    if len(descs) == 1:
        top = dict(descs[0])
        top.pop("platform")
    else:
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": descs}
        digest, size = _blob(layout, _canon(index))
        top = {"mediaType": index["mediaType"], "digest": digest, "size": size}
    top["annotations"] = {"org.opencontainers.image.ref.name": tag}
    idx_path = layout / "index.json"
    existing = json.loads(idx_path.read_text())["manifests"] if idx_path.exists() else []
    existing = [m for m in existing
                if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag]
    idx_path.write_text(json.dumps({"schemaVersion": 2, "manifests": [*existing, top]}))
    return str(top["digest"])


def applets() -> list[str]:
    out = subprocess.run([str(BUSYBOX), "--list"], check=True, capture_output=True, text=True)
    return sorted(a for a in out.stdout.split() if a and a != "busybox")


def busybox_layers() -> list[list[Entry]]:
    """Three layers: the base system, some content, then a whiteout and an opaque dir."""
    base = [directory("bin"), directory("etc"), directory("tmp", 0o1777), directory("root", 0o700),
            directory("home"), directory("dev"), directory("proc"), directory("sys"),
            directory("var"), directory("data"),
            file("bin/busybox", BUSYBOX.read_bytes(), 0o755)]
    base += [symlink(f"bin/{a}", "busybox") for a in applets()]
    base += [file("etc/passwd", PASSWD), file("etc/group", GROUP),
             file("etc/hostname", "pycri-test\n"), file("etc/removed", "gone in layer 3\n"),
             file("data/old", "from layer 1\n")]
    extra = [directory("home/user1", 0o755, 1000, 1000),
             file("home/user1/hello", "hello\n", 0o644, 1000, 1000),
             file("etc/motd", "pycri test image\n"), hardlink("etc/motd.link", "etc/motd"),
             file("data/old2", "from layer 2\n")]
    top = [whiteout("etc/removed"), directory("data"), opaque("data"),
           file("data/new", "from layer 3\n")]
    return [base, extra, top]


def busybox_spec(**kw: Any) -> ImageSpec:
    return ImageSpec(layers=busybox_layers(), **kw)


def skopeo_push(layout: Path, tag: str, dest: str, fmt: str | None = None,
                all_images: bool = False) -> None:
    """Push `oci:layout:tag` to `docker://dest` over plain http."""
    cmd = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--preserve-digests"]
    if fmt:
        cmd += ["--format", fmt]
        cmd.remove("--preserve-digests")
    if all_images:
        cmd.append("--all")
    cmd += [f"oci:{layout}:{tag}", f"docker://{dest}"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)


def push_image(addr: str, layout: Path, name: str, tag: str, specs: list[ImageSpec],
               fmt: str | None = None) -> str:
    """Write `specs` into `layout` under `tag` and push them to `addr/name:tag`."""
    write_layout(layout, tag, specs)
    skopeo_push(layout, tag, f"{addr}/{name}:{tag}", fmt=fmt, all_images=len(specs) > 1)
    return f"{addr}/{name}:{tag}"


def push_busybox(addr: str, layout: Path, name: str = "busybox", tag: str = "latest",
                 **kw: Any) -> str:
    """The standard test busybox at `addr/name:tag`; keyword args go to ImageSpec."""
    return push_image(addr, layout, name, tag, [busybox_spec(**kw)])


def arm64_spec() -> ImageSpec:
    """A tiny second platform for index tests (never runnable here)."""
    return ImageSpec(layers=[[file("platform", "arm64\n")]], architecture="arm64", variant="v8")
