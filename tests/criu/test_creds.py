"""What a checkpoint's processes were allowed (pycri/criu/creds.py), read from core
images that CRIU's own `crit` encoded, against an OCI spec as pycri generates it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pycri.criu import creds
from pycri.errors import FailedPrecondition, InvalidArgument
from pycri.oci.spec.capabilities import ALL_CAPABILITIES, DEFAULT_CAPABILITIES
from tests.lib.criu_images import write_core


def spec(uid: int = 1000, caps: tuple[str, ...] = (), seccomp: bool = True) -> dict[str, Any]:
    sets = {k: list(caps) for k in ("bounding", "effective", "permitted")}
    doc: dict[str, Any] = {"process": {"user": {"uid": uid, "gid": uid, "additionalGids": []},
                                       "capabilities": sets}, "linux": {}}
    if seccomp:
        doc["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ERRNO"}
    return doc


def test_a_checkpoint_within_the_request_restores(tmp_path: Path) -> None:
    write_core(tmp_path, pid=1, uid=1000, groups=[1000])
    write_core(tmp_path, pid=7, uid=1000, seccomp="strict")
    creds.check(tmp_path, spec())
    [t, _] = creds.threads(tmp_path)
    assert (t.uids, t.gids, t.groups, t.seccomp) == ({1000}, {1000}, {1000}, 2)
    write_core(tmp_path, pid=8, uid=0, caps=DEFAULT_CAPABILITIES, seccomp="disabled")
    creds.check(tmp_path, spec(uid=0, caps=DEFAULT_CAPABILITIES, seccomp=False))


def test_more_than_the_request_grants_is_refused_naming_it(tmp_path: Path) -> None:
    write_core(tmp_path, pid=1, uid=0, caps=ALL_CAPABILITIES, seccomp="disabled", groups=[6])
    with pytest.raises(FailedPrecondition) as e:
        creds.check(tmp_path, spec())
    message = str(e.value)
    for part in ("core-1.img ran as uid 0, the request grants uid 1000", "gid 0",
                 "groups 6", "CAP_SYS_ADMIN", "ran without seccomp"):
        assert part in message, message


def test_another_uid_is_fine_where_the_request_could_switch_to_it(tmp_path: Path) -> None:
    """A root container whose process dropped to nobody: it could do so itself."""
    write_core(tmp_path, uid=65534)
    creds.check(tmp_path, spec(uid=0, caps=DEFAULT_CAPABILITIES))
    with pytest.raises(FailedPrecondition, match="uid 65534"):
        creds.check(tmp_path, spec(uid=0, caps=("CAP_CHOWN",)))


@pytest.mark.parametrize(("data", "message"), [
    (b"", "truncated"),
    (b"\x19CVT" + b"\x00" * 8, "not a CRIU core image"),
    (b"\x19CVTG8\x05U" + b"\xff\x00\x00\x00" + b"\x08", "truncated"),
    (b"\x19CVTG8\x05U\x04\x00\x00\x00\x2a\xff\xff\xff", "truncated"),
    (b"\x19CVTG8\x05U\x02\x00\x00\x00\x08\x01", "no credentials"),
    (b"G8\x05U\x03\x00\x00\x00\x0b\x00\x00", "wire type 3"),
])
def test_a_malformed_core_image_is_invalid(tmp_path: Path, data: bytes, message: str) -> None:
    (tmp_path / "core-1.img").write_bytes(data)
    with pytest.raises(InvalidArgument, match=message):
        creds.check(tmp_path, spec())


def test_a_checkpoint_without_a_process_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="no process"):
        creds.check(tmp_path, spec())
    (tmp_path / "core-1.img").mkdir()
    with pytest.raises(InvalidArgument, match="not a regular file"):
        creds.check(tmp_path, spec())
