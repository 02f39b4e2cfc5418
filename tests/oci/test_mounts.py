"""mounts.py: mountinfo parsing, host path checks, propagation checks on real mounts."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci.mounts import (
    check_propagation,
    find_mount,
    parse_mountinfo,
    validate_host_path,
)

MOUNTINFO = """\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:22 / /data rw,relatime master:3 - ext4 /dev/vdb rw
24 22 0:23 / /data/inner rw - tmpfs tmpfs rw
25 22 0:24 / /with\\040space rw shared:7 master:2 - tmpfs tmpfs rw
26 24 0:25 / /data/inner rw shared:9 - tmpfs tmpfs rw
garbage
"""

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount")


def test_parse_mountinfo() -> None:
    ms = parse_mountinfo(MOUNTINFO)
    points = [m.mount_point for m in ms]
    assert points == ["/", "/data", "/data/inner", "/with space", "/data/inner"]
    assert (ms[0].shared, ms[0].slave) == (True, False)
    assert (ms[1].shared, ms[1].slave) == (False, True)
    assert (ms[2].shared, ms[2].slave) == (False, False)
    assert (ms[3].shared, ms[3].slave) == (True, True)
    assert (ms[0].mount_id, ms[1].parent_id) == (22, 22)


def test_find_mount_longest_prefix_and_stacking() -> None:
    ms = parse_mountinfo(MOUNTINFO)
    assert find_mount("/data/x", ms).mount_id == 23
    assert find_mount("/database", ms).mount_id == 22  # a prefix of the name is not a parent
    assert find_mount("/data/inner/f", ms).mount_id == 26  # the top of the stack
    assert find_mount("/with space/a", ms).mount_id == 25
    with pytest.raises(InvalidArgument):
        find_mount("/x", [])


def test_validate_host_path(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    os.symlink(tmp_path / "dir", tmp_path / "link")
    assert validate_host_path(str(tmp_path / "dir")).is_dir is True
    assert validate_host_path(str(tmp_path / "file")).is_dir is False
    hp = validate_host_path(str(tmp_path / "link"))
    assert (hp.path, hp.is_dir) == (str(tmp_path / "dir"), True)
    with pytest.raises(InvalidArgument, match=r"missing does not exist"):
        validate_host_path(str(tmp_path / "missing"))
    with pytest.raises(InvalidArgument, match="absolute"):
        validate_host_path("relative/path")


def test_check_propagation_from_file(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    check_propagation("/", pb.PROPAGATION_BIDIRECTIONAL, str(info))
    check_propagation("/data/x", pb.PROPAGATION_HOST_TO_CONTAINER, str(info))
    with pytest.raises(InvalidArgument, match="mounted on /data but it is not a shared mount"):
        check_propagation("/data/x", pb.PROPAGATION_BIDIRECTIONAL, str(info))


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@pytest.fixture
def mounter() -> Iterator[list[Path]]:
    """A list the test appends mount points to; each one is lazily unmounted at teardown."""
    made: list[Path] = []
    try:
        yield made
    finally:
        for target in reversed(made):
            subprocess.run(["umount", "-l", str(target)], capture_output=True)


def _tmpfs(made: list[Path], target: Path) -> Path:
    target.mkdir(exist_ok=True)
    _run("mount", "-t", "tmpfs", "tmpfs", str(target))
    made.append(target)
    return target


@root_only
def test_propagation_on_real_mounts(tmp_path: Path, mounter: list[Path]) -> None:
    private = _tmpfs(mounter, tmp_path / "private")
    _run("mount", "--make-private", str(private))
    (private / "sub").mkdir()
    check_propagation(str(private / "sub"), pb.PROPAGATION_PRIVATE)
    with pytest.raises(InvalidArgument, match="not a shared mount"):
        check_propagation(str(private / "sub"), pb.PROPAGATION_BIDIRECTIONAL)
    with pytest.raises(InvalidArgument, match="not a shared or slave"):
        check_propagation(str(private / "sub"), pb.PROPAGATION_HOST_TO_CONTAINER)

    shared = _tmpfs(mounter, tmp_path / "shared")
    _run("mount", "--make-shared", str(shared))
    check_propagation(str(shared), pb.PROPAGATION_BIDIRECTIONAL)
    check_propagation(str(shared), pb.PROPAGATION_HOST_TO_CONTAINER)

    slave = tmp_path / "slave"
    slave.mkdir()
    _run("mount", "--bind", str(shared), str(slave))
    mounter.append(slave)
    _run("mount", "--make-slave", str(slave))
    check_propagation(str(slave), pb.PROPAGATION_HOST_TO_CONTAINER)
    with pytest.raises(InvalidArgument, match=f"mounted on {slave} but it is not a shared"):
        check_propagation(str(slave), pb.PROPAGATION_BIDIRECTIONAL)
