"""pycri/errors.py: a failing filesystem is a domain error naming the filesystem, inside
a step or not; any other OSError is not one."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pycri import errors


@pytest.mark.parametrize(("code", "kind", "words"), [
    (errno.ENOSPC, errors.ResourceExhausted, "no space left on"),
    (errno.EDQUOT, errors.ResourceExhausted, "disk quota exceeded on"),
    (errno.EROFS, errors.FailedPrecondition, "read-only:"),
    (errno.EIO, errors.Unavailable, "I/O error on"),
])
def test_filesystem_faults_name_the_filesystem(tmp_path: Path, code: int,
                                               kind: type[errors.PycriError], words: str) -> None:
    missing = tmp_path / "a" / "b" / "file"  # not there yet: its nearest ancestor counts
    fault = errors.host_fault(OSError(code, os.strerror(code), str(missing)))
    assert type(fault) is kind
    assert str(fault) == f"{words} {errors.filesystem(tmp_path)}"
    assert str(fault).startswith(f"{words} the filesystem mounted at /")


def test_the_mount_point_is_found_by_device(tmp_path: Path) -> None:
    assert errors.filesystem("/proc/self/status") == "the filesystem mounted at /proc"
    assert errors.filesystem("/") == "the filesystem mounted at /"


def test_other_errors_are_not_faults() -> None:
    assert errors.host_fault(OSError(errno.ENOENT, "No such file", "/x")) is None
    assert errors.host_fault(OSError(errno.EACCES, "Permission denied", "/x")) is None
    fault = errors.host_fault(OSError(errno.ENOSPC, "No space left on device"))
    assert str(fault) == "no space left on a filesystem of the node (No space left on device)"


async def test_a_step_keeps_the_faults_code_and_names_the_step(tmp_path: Path) -> None:
    with pytest.raises(errors.ResourceExhausted, match=r"^writing the pod files: no space left "
                       r"on the filesystem mounted at /"):
        async with errors.step("writing the pod files"):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "hosts"))
    with pytest.raises(errors.PycriError) as e:
        async with errors.step("reading"):
            raise OSError(errno.ENOENT, "No such file or directory", "/gone")
    assert type(e.value) is errors.PycriError
