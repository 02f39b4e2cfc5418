"""Hostile images (issue 8): each attack of the corpus is refused at pull with a clear
error, nothing of it is stored, and a canary on the host is untouched byte for byte."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.image.conftest import Maker
from tests.image.test_pull import _empty_state
from tests.lib import hostile
from tests.lib.hostile import HostileRegistry

# Small bounds so that bombs are refused after a few MiB (the defaults allow 64 MiB).
BOUNDS = {"max_layer_expansion_ratio": 100.0, "min_layer_unpacked_bytes": 4 << 20,
          "unpack_free_space_reserve": 0}


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


@pytest.mark.parametrize("name", hostile.NAMES)
async def test_hostile_image(name: str, make_manager: Maker, hostile_registry: HostileRegistry,
                             tmp_path: Path) -> None:
    canary = make_canary(tmp_path)
    before = snapshot(canary)
    ref = hostile_registry.push("corpus", name, hostile.build(name, canary))
    m = make_manager(**BOUNDS)
    expect = hostile.EXPECT[name]
    if expect is None:
        iid = await m.pull(ref)
        assert m.status(iid) is not None
        await m.remove(iid)
    else:
        cls, pattern = expect
        with pytest.raises(cls, match=pattern):
            await m.pull(ref)
    _empty_state(m)
    assert snapshot(canary) == before
