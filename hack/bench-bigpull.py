#!/usr/bin/env python3
"""Cold pulls of a large, realistic image: pycri, containerd and the floor, in one run.

Not a test. It builds (once, cached in --work) a gzip image from host trees: by
default /usr/lib/x86_64-linux-gnu (big shared libraries), /usr/share (~54,000 small
files) and a third tree, over 1.5 GB and 50,000 files unpacked, pushes it to a local
registry, then measures, round by round and interleaved:

  each endpoint   RemoveImage, a wait until its disk is back, --settle seconds of
                  quiet (see quiet()), then a timed PullImage with the daemon's CPU
                  (/proc/PID/stat, its own and its reaped children's), Version every
                  10 ms meanwhile (p50/p99), and the daemon root's disk use after,
                  less the use before
  floor           after the same quiet, `gzip -dc BLOB | tar -x` of the same blobs,
                  one after another, with no runtime: what the disk and one inflater
                  take

and prints medians and the ratios the issue asks of pycri (issue 40), the first
endpoint against each other one. It starts no daemon; each endpoint is
NAME=SOCKET=ROOT (the daemon is the process listening on SOCKET; ROOT is where it
keeps images). Run as root:

    .venv/bin/python hack/bench-bigpull.py --registry 127.0.0.1:5000 \\
        --endpoint pycri=/run/pycri-bench/pycri.sock=/var/tmp/pycri-bench/root \\
        --endpoint containerd=/run/containerd/containerd.sock=/var/lib/containerd \\
        [--rounds 3] [--trees /usr/lib/x86_64-linux-gnu,/usr/share,/opt/gobin]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc

TREES = "/usr/lib/x86_64-linux-gnu,/usr/share,/opt/gobin"
CHUNK = 1 << 20


# ---- the image -------------------------------------------------------------------------


def _layer(tree: str, out: Path) -> dict[str, object]:
    """`tree` as a gzip (level 6) tar blob in `out`; its digest, size and diff ID."""
    from zlib_ng import zlib_ng

    tar = subprocess.Popen(["tar", "-C", "/", "--numeric-owner", "-cf", "-",
                            tree.lstrip("/")], stdout=subprocess.PIPE)
    assert tar.stdout is not None
    diff, blob_hash = hashlib.sha256(), hashlib.sha256()
    z = zlib_ng.compressobj(6, zlib_ng.DEFLATED, 31)
    tmp = out / "blob.tmp"
    size = raw = 0
    with open(tmp, "wb") as f:
        while data := tar.stdout.read(CHUNK):
            raw += len(data)
            diff.update(data)
            packed = z.compress(data)
            blob_hash.update(packed)
            f.write(packed)
            size += len(packed)
        packed = z.flush()
        blob_hash.update(packed)
        f.write(packed)
        size += len(packed)
    if tar.wait() not in (0, 1):  # 1: a file changed while read, as on a live host
        raise SystemExit(f"tar of {tree} failed")
    digest = "sha256:" + blob_hash.hexdigest()
    tmp.rename(out / "blobs" / "sha256" / digest[7:])
    return {"digest": digest, "size": size, "diff_id": "sha256:" + diff.hexdigest(),
            "raw": raw, "tree": tree}


def _put(layout: Path, doc: dict[str, object]) -> tuple[str, int]:
    data = json.dumps(doc, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest[7:]).write_bytes(data)
    return digest, len(data)


def build(work: Path, trees: list[str]) -> tuple[Path, list[dict[str, object]]]:
    """The OCI layout of the image (built once per list of trees, then reused)."""
    key = hashlib.sha256("\n".join(trees).encode()).hexdigest()[:12]
    layout = work / f"layout-{key}"
    done = layout / "layers.json"
    if done.exists():
        return layout, json.loads(done.read_text())
    shutil.rmtree(layout, ignore_errors=True)
    (layout / "blobs" / "sha256").mkdir(parents=True)
    layers = []
    for tree in trees:
        t = time.monotonic()
        layers.append(_layer(tree, layout))
        print(f"  layer {tree}: {layers[-1]['raw']} bytes, {layers[-1]['size']} gzipped, "
              f"{time.monotonic() - t:.0f} s", flush=True)
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Cmd": ["/bin/true"]},
              "rootfs": {"type": "layers", "diff_ids": [lay["diff_id"] for lay in layers]}}
    cdigest, csize = _put(layout, config)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": cdigest, "size": csize},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": lay["digest"], "size": lay["size"]} for lay in layers]}
    mdigest, msize = _put(layout, manifest)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdigest,
        "size": msize, "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}))
    done.write_text(json.dumps(layers))
    return layout, layers


def push(layout: Path, ref: str) -> None:
    subprocess.run(["skopeo", "copy", "--quiet", "--preserve-digests",
                    "--dest-tls-verify=false", f"oci:{layout}:v1", f"docker://{ref}"],
                   check=True, timeout=1800)


# ---- the daemons -----------------------------------------------------------------------


def socket_pid(path: str) -> int:
    """The process holding the listening unix socket at `path`."""
    inodes = set()
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and parts[7] == path and parts[5] == "01":  # listening
                inodes.add(f"socket:[{parts[6]}]")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(d.name)
        except OSError:
            continue
    raise SystemExit(f"nothing listens on {path}")


def cpu_seconds(pid: int) -> float:
    """The process's user+system time and its reaped children's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def disk_use(root: Path) -> int:
    """Allocated bytes under `root`, each inode once (hard links, overlay lower dirs)."""
    seen: set[tuple[int, int]] = set()
    used = 0
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            used += st.st_blocks * 512
    return used


@dataclass
class Endpoint:
    name: str
    socket: str
    root: Path
    pid: int = 0
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    versions: list[float] = field(default_factory=list)
    disks: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pid = socket_pid(self.socket)
        channel = grpc.insecure_channel(f"unix://{self.socket}")
        self.img = api_pb2_grpc.ImageServiceStub(channel)
        self.rt = api_pb2_grpc.RuntimeServiceStub(grpc.insecure_channel(
            f"unix://{self.socket}"))  # its own connection: Version beside the pull

    def absent(self, ref: str) -> None:
        spec = pb.ImageSpec(image=ref)
        st = self.img.ImageStatus(pb.ImageStatusRequest(image=spec), timeout=60)
        if st.HasField("image"):
            self.img.RemoveImage(pb.RemoveImageRequest(image=spec), timeout=300)
        # containerd collects content and snapshots after the call: wait for the disk.
        last, deadline = -1, time.monotonic() + 120
        while time.monotonic() < deadline:
            now = disk_use(self.root)
            if now == last:
                break
            last = now
            time.sleep(2)

    def pull(self, ref: str, settle: float) -> None:
        self.absent(ref)
        before = disk_use(self.root)
        quiet(settle)
        stop = threading.Event()
        lat: list[float] = []

        def poll() -> None:
            while not stop.wait(0.01):
                t = time.perf_counter()
                self.rt.Version(pb.VersionRequest(), timeout=30)
                lat.append((time.perf_counter() - t) * 1000)

        poller = threading.Thread(target=poll, daemon=True)
        cpu = cpu_seconds(self.pid)
        t = time.monotonic()
        poller.start()
        self.img.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=1800)
        wall = time.monotonic() - t
        stop.set()
        poller.join()
        self.walls.append(wall)
        self.cpus.append(cpu_seconds(self.pid) - cpu)
        self.versions += lat
        self.disks.append(disk_use(self.root) - before)
        print(f"  {self.name}: {wall:.1f} s, CPU {self.cpus[-1]:.1f} s, Version p99 "
              f"{quantile(lat, 0.99):.1f} ms, disk +{self.disks[-1] / 1e9:.2f} GB", flush=True)


def quiet(settle: float) -> None:
    """Sync, then wait `settle` seconds. On ext4 without a journal (the root of the
    machine these figures come from) an inode freed in the last minute (five, while
    its inode table block is dirty) is skipped by the allocator, one by one, so right
    after a removal of 60,000 files every file created costs several times more: a
    timed run must not start in the wake of the last one's removal. Better still, put
    the daemons' roots and --floor-dir on one journaled ext4 made for the run, where
    the allocator does not look back (docs/benchmarks.md)."""
    subprocess.run(["sync"], check=True)
    time.sleep(settle)


def floor(layout: Path, layers: list[dict[str, object]], work: Path,
          settle: float) -> tuple[float, int]:
    """`gzip -dc | tar -x` of every blob in order into one fresh dir: (seconds, bytes)."""
    dest = Path(tempfile.mkdtemp(dir=work, prefix="floor-"))
    try:
        quiet(settle)
        t = time.monotonic()
        for lay in layers:
            blob = layout / "blobs" / "sha256" / str(lay["digest"])[7:]
            subprocess.run(f"gzip -dc {blob} | tar -x --numeric-owner -C {dest}",
                           shell=True, check=True)
        wall = time.monotonic() - t
        return wall, disk_use(dest)
    finally:
        shutil.rmtree(dest)


def quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--registry", required=True, help="a plain-http registry on loopback")
    ap.add_argument("--endpoint", action="append", required=True, help="NAME=SOCKET=ROOT")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=65.0,
                    help="seconds of quiet before each timed run (see quiet())")
    ap.add_argument("--trees", default=TREES, help="comma-separated host trees, a layer each")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/pycri-bigpull"))
    ap.add_argument("--floor-dir", type=Path,
                    help="where the floor unpacks (default --work): the daemons' filesystem")
    ap.add_argument("--json", type=Path, help="write the samples here too")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    eps = [Endpoint(n, s, Path(r)) for n, s, r in (e.split("=", 2) for e in args.endpoint)]
    print("== image", flush=True)
    layout, layers = build(args.work, args.trees.split(","))
    raw = sum(int(str(lay["raw"])) for lay in layers)
    packed = sum(int(str(lay["size"])) for lay in layers)
    ref = f"{args.registry}/bench/bigpull-{layout.name[7:]}:v1"
    push(layout, ref)
    print(f"  {ref}: {len(layers)} layers, {packed / 1e6:.0f} MB gzipped, tar "
          f"{raw / 1e6:.0f} MB", flush=True)
    floors: list[float] = []
    unpacked = 0
    for r in range(args.rounds):
        print(f"== round {r + 1}", flush=True)
        for ep in (eps if r % 2 == 0 else eps[::-1]):
            ep.pull(ref, args.settle)
        wall, unpacked = floor(layout, layers, args.floor_dir or args.work, args.settle)
        floors.append(wall)
        print(f"  floor: {wall:.1f} s, {unpacked / 1e9:.2f} GB on disk", flush=True)
    for ep in eps:
        ep.absent(ref)
    fl = statistics.median(floors)
    print(f"\n== medians of {args.rounds} cold pulls; unpacked {unpacked / 1e9:.2f} GB")
    print(f"{'':12}{'wall s':>9}{'CPU s':>9}{'Version p50':>13}{'p99 ms':>8}{'disk GB':>9}"
          f"{'/unpacked':>10}{'/floor':>8}")
    for ep in eps:
        wall, disk = statistics.median(ep.walls), statistics.median(ep.disks)
        print(f"{ep.name:12}{wall:9.1f}{statistics.median(ep.cpus):9.1f}"
              f"{quantile(ep.versions, 0.5):13.1f}{quantile(ep.versions, 0.99):8.1f}"
              f"{disk / 1e9:9.2f}{disk / unpacked:10.2f}{wall / fl:8.2f}")
    print(f"{'floor':12}{fl:9.1f}")
    first = eps[0]
    for other in eps[1:]:
        wall = statistics.median(first.walls) / statistics.median(other.walls)
        cpu = statistics.median(first.cpus) / statistics.median(other.cpus)
        print(f"{first.name}/{other.name}: wall {wall:.2f}, CPU {cpu:.2f}")
    if args.json:
        args.json.write_text(json.dumps({
            "floor": floors, "unpacked": unpacked, "layers": layers,
            "endpoints": {e.name: {"wall": e.walls, "cpu": e.cpus, "disk": e.disks,
                                   "version_p99": quantile(e.versions, 0.99)} for e in eps}},
            indent=1))


if __name__ == "__main__":
    main()
