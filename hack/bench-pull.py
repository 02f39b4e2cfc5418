#!/usr/bin/env python3
"""Pull+unpack benchmark: a ~200 MB, 4-layer image from a local docker-registry.

Prints MB/s for a cold pull and for unpack alone (blobs already in the
content store), which shows how the time splits between download+verify and
decompress+extract. Not a test; run as root:
    .venv/bin/python hack/bench-pull.py [--mb 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pycri.config import ImagesConfig
from pycri.image.manager import ImageManager
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pull-") as tmp:
        work = Path(tmp)
        reg = Registry(work / "reg").start()
        try:
            t = time.monotonic()
            ref = images.push_image(reg.addr, work / "layout", "bench", "v1",
                                    [images.ImageSpec(layers=layers(args.mb))])
            print(f"build+push: {time.monotonic() - t:.1f}s", flush=True)
            blobs = work / "layout/blobs/sha256"
            blob_mb = sum(p.stat().st_size for p in blobs.iterdir()) / 1e6
            root = work / "root"
            cold = asyncio.run(pull_once(root, ref))
            # Unpack only: keep the blobs, drop the unpacked layers and the records.
            shutil.rmtree(root / "layers")
            shutil.rmtree(root / "l")
            for p in root.glob("pycri.db*"):
                p.unlink()
            warm = asyncio.run(pull_once(root, ref))
            print(f"image: {args.mb} MB uncompressed, {blob_mb:.0f} MB compressed")
            print(f"cold pull+unpack: {cold:.2f}s = {args.mb / cold:.0f} MB/s")
            print(f"unpack only:      {warm:.2f}s = {args.mb / warm:.0f} MB/s")
        finally:
            reg.stop()


if __name__ == "__main__":
    main()
