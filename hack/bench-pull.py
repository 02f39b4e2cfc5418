#!/usr/bin/env python3
"""Pull+unpack benchmark: a ~200 MB, 4-layer image from a local docker-registry.

Drives pycri's ImageManager in-process (no daemon, no gRPC) and prints, as the
median of --repeat rounds, the time and MiB/s of: a cold pull+unpack; unpack
alone (blobs already in the content store); download+verify of the layer blobs
alone; and, layer by layer, gunzip (+ the diff-ID hash) alone and untar of the
already uncompressed tars alone. Not a test; run as root:
    .venv/bin/python hack/bench-pull.py [--mb 200] [--repeat 3]
    .venv/bin/python hack/bench-pull.py --ref 127.0.0.1:5000/bench/big:200

With --push-to it only builds the image and pushes it to that (plain-http)
registry, then prints the reference, e.g. for hack/bench.py --pull-image:
    .venv/bin/python hack/bench-pull.py --push-to 127.0.0.1:5000 --name bench/big:200
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pycri.config import ImagesConfig
from pycri.image import reference
from pycri.image.manager import ImageManager
from pycri.image.regconf import RegistriesConf
from pycri.image.unpack import unpack_layer
from pycri.store.db import Store
from tests.lib import images
from tests.lib.registry import Registry


def layers(total_mb: int) -> list[list[images.Entry]]:
    """Half random (incompressible), half repetitive data, 1 MiB files."""
    out = []
    text = (b"pycri benchmark line\n" * 25000)[: 512 * 1024]
    for n in range(4):
        entries = [images.directory(f"l{n}")]
        for i in range(total_mb // 4):
            entries.append(images.file(f"l{n}/f{i}", os.urandom(512 * 1024) + text))
        out.append(entries)
    return out


async def pull_once(root: Path, ref: str) -> float:
    store = Store(root / "pycri.db")
    m = ImageManager(root, ImagesConfig(registries_conf="", registries_conf_dir=""), store)
    t = time.monotonic()
    await m.pull(ref)
    dt = time.monotonic() - t
    await m.close()
    store.close()
    return dt


async def download_once(root: Path, ref: str) -> tuple[float, list[tuple[str, str]]]:
    """Download+verify of the layer blobs alone, through the daemon's own code path
    (same client, same concurrency limit), no unpack. Returns (s, [(digest, diff_id)])."""
    store = Store(root / "pycri.db")
    m = ImageManager(root, ImagesConfig(registries_conf="", registries_conf_dir=""), store)
    r = reference.parse(ref)
    eps = RegistriesConf.load("", "").endpoints(r)
    data, _, _, ep = await m._top_manifest(eps, r, None)
    manifest = json.loads(data)
    cfg = manifest["config"]
    await m._download([ep], None, cfg["digest"], cfg["size"])
    diff_ids = json.loads(m.content.read(cfg["digest"]))["rootfs"]["diff_ids"]
    t = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        for layer in manifest["layers"]:
            tg.create_task(m._download([ep], None, layer["digest"], layer["size"]))
    dt = time.monotonic() - t
    await m.close()
    store.close()
    return dt, [(la["digest"], d) for la, d in zip(manifest["layers"], diff_ids, strict=True)]


def decompress_only(blobs: list[Path], tars: Path) -> float:
    """gunzip + diff-ID sha256 of each layer, one after the other, as unpack reads it
    (gzip.GzipFile, 1 MiB reads); the tar is kept for untar_only (written after the
    clock stops for each layer)."""
    total = 0.0
    for b in blobs:
        out = bytearray()
        t = time.monotonic()
        with open(b, "rb") as raw:
            h = hashlib.sha256()
            f = gzip.GzipFile(fileobj=raw, mode="rb")
            while chunk := f.read(1 << 20):
                h.update(chunk)
                out += chunk
        total += time.monotonic() - t
        (tars / b.name).write_bytes(out)
    return total


def untar_only(tars: Path, dest: Path, tmp: Path) -> float:
    """pycri's extractor over the uncompressed tars, one layer after the other."""
    total = 0.0
    for n, tar in enumerate(sorted(tars.iterdir())):
        t = time.monotonic()
        unpack_layer(tar, dest / f"u{n}", tmp, None)
        total += time.monotonic() - t
    return total


def measure(ref: str, work: Path, mb: int) -> dict[str, float]:
    for d in ("root", "dl", "tars", "untar", "untar-tmp"):
        shutil.rmtree(work / d, ignore_errors=True)
    root = work / "root"
    cold = asyncio.run(pull_once(root, ref))
    # Unpack only: keep the blobs, drop the unpacked layers and the records.
    shutil.rmtree(root / "layers")
    shutil.rmtree(root / "l")
    for p in root.glob("pycri.db*"):
        p.unlink()
    warm = asyncio.run(pull_once(root, ref))
    dl, layer_ids = asyncio.run(download_once(work / "dl", ref))
    blobs = [work / "dl/content/blobs/sha256" / d.split(":")[1] for d, _ in layer_ids]
    (work / "tars").mkdir()
    dec = decompress_only(blobs, work / "tars")
    (work / "untar").mkdir()
    (work / "untar-tmp").mkdir()
    untar = untar_only(work / "tars", work / "untar", work / "untar-tmp")
    return {"cold": cold, "unpack": warm, "download": dl, "decompress": dec, "untar": untar}


def push_only(addr: str, name: str, mb: int) -> None:
    repo, _, tag = name.rpartition(":")
    if not repo or "/" in tag:
        sys.exit(f"--name must be NAME:TAG, got {name!r}")
    with tempfile.TemporaryDirectory(prefix="bench-pull-") as tmp:
        work = Path(tmp)
        t = time.monotonic()
        ref = images.push_image(addr, work / "layout", repo, tag,
                                [images.ImageSpec(layers=layers(mb))])
        blobs = work / "layout/blobs/sha256"
        blob_mb = sum(p.stat().st_size for p in blobs.iterdir()) / 1e6
        print(f"build+push: {time.monotonic() - t:.1f}s; {mb} MB uncompressed in 4 layers, "
              f"{blob_mb:.0f} MB of blobs", file=sys.stderr, flush=True)
    print(ref)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--push-to", metavar="HOST:PORT",
                    help="only build the image, push it to this registry, print its reference")
    ap.add_argument("--name", default="bench/big:200", help="NAME:TAG for --push-to")
    ap.add_argument("--ref", help="measure this (plain-http, localhost) image instead of "
                    "building one; --mb must then give its uncompressed size in MiB")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the median is printed")
    args = ap.parse_args()
    if args.push_to:
        push_only(args.push_to, args.name, args.mb)
        return
    with tempfile.TemporaryDirectory(prefix="bench-pull-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        reg = None
        try:
            if args.ref:
                ref = args.ref
            else:
                reg = Registry(work / "reg").start()
                t = time.monotonic()
                ref = images.push_image(reg.addr, work / "layout", "bench", "v1",
                                        [images.ImageSpec(layers=layers(args.mb))])
                print(f"build+push: {time.monotonic() - t:.1f}s", flush=True)
            runs = []
            for i in range(args.repeat):
                runs.append(measure(ref, work / "m", args.mb))
                print(f"round {i + 1}: " + ", ".join(f"{k} {v:.2f}s" for k, v in runs[-1].items()),
                      flush=True)
            blob_mb = sum(p.stat().st_size
                          for p in (work / "m/dl/content/blobs/sha256").iterdir()) / 1e6
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"image {ref}: {args.mb} MiB uncompressed, {blob_mb:.0f} MB compressed; "
                  f"median of {len(runs)}")
            rows = [
                ("cold pull+unpack (PullImage's work)", "cold", args.mb),
                ("unpack only (blobs present; 4 layers at once)", "unpack", args.mb),
                ("download+verify only (layers at once)", "download", blob_mb / 1.048576),
                ("  gunzip+diff-ID sha256, serial", "decompress", args.mb),
                ("  untar (pycri extractor) of plain tar, serial", "untar", args.mb),
            ]
            for label, key, mib in rows:
                print(f"{label:<50} {med[key]:6.2f}s  {mib / med[key]:6.0f} MiB/s")
            print(f"(MiB/s of uncompressed data, except download: of compressed data; "
                  f"{args.mb} MiB = {args.mb * 1.048576:.0f} MB)")
        finally:
            if reg is not None:
                reg.stop()


if __name__ == "__main__":
    main()
