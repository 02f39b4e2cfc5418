"""What a checkpoint's processes were allowed (pycri/criu/creds.py), read from core
images that CRIU's own `crit` encoded, against an OCI spec as pycri generates it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pycri.criu import creds
from pycri.errors import FailedPrecondition, InvalidArgument
from pycri.oci.spec.capabilities import ALL_CAPABILITIES, DEFAULT_CAPABILITIES
from tests.lib.criu_images import ALLOW_ALL, DENY_ALL, write_core, write_seccomp


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


def test_the_checkpoints_seccomp_filters_are_compared_with_the_requests(tmp_path: Path) -> None:
    """Issue 39, item 5: a thread that ran under a filter letting everything through was
    restored into a container asking for a profile, as only the filter's presence was
    checked. Now it is refused, naming what the filter lets through."""
    write_seccomp(tmp_path, [ALLOW_ALL])
    write_core(tmp_path, pid=1, uid=1000)
    with pytest.raises(FailedPrecondition) as e:
        creds.check(tmp_path, spec())
    assert "core-1.img ran under seccomp filters that let through what the request's " \
           "profile does not: " in str(e.value)
    assert "read on x86_64 (ALLOW, the profile: ERRNO)" in str(e.value)
    creds.check(tmp_path, spec(seccomp=False))  # an unconfined request: anything goes
    # the strictest filter of a thread's chain wins: ALLOW_ALL (1) over DENY_ALL (0)
    write_seccomp(tmp_path, [DENY_ALL, ALLOW_ALL])
    write_core(tmp_path, pid=1, uid=1000, seccomp_filter=1)
    creds.check(tmp_path, spec())
    write_seccomp(tmp_path, [DENY_ALL, ALLOW_ALL], prevs=[None, None])  # ALLOW_ALL alone
    with pytest.raises(FailedPrecondition, match="let through"):
        creds.check(tmp_path, spec())


def test_older_images_keep_the_mode_and_filter_in_the_tasks_core(tmp_path: Path) -> None:
    write_seccomp(tmp_path, [ALLOW_ALL])
    write_core(tmp_path, uid=1000, task_seccomp=True)
    assert creds.threads(tmp_path)[0].seccomp_filter == 0
    with pytest.raises(FailedPrecondition, match="let through"):
        creds.check(tmp_path, spec())


def test_unmitigated_speculation_is_refused_unless_asked_for(tmp_path: Path) -> None:
    write_seccomp(tmp_path, [DENY_ALL], flags=4)  # SECCOMP_FILTER_FLAG_SPEC_ALLOW
    write_core(tmp_path, uid=1000)
    with pytest.raises(FailedPrecondition, match="SECCOMP_FILTER_FLAG_SPEC_ALLOW"):
        creds.check(tmp_path, spec())
    doc = spec()
    doc["linux"]["seccomp"]["flags"] = ["SECCOMP_FILTER_FLAG_SPEC_ALLOW"]
    creds.check(tmp_path, doc)


def test_filters_that_are_missing_or_cannot_be_compared_are_refused(tmp_path: Path) -> None:
    write_core(tmp_path, pid=1, uid=1000, seccomp_filter=None)
    with pytest.raises(FailedPrecondition, match="filters the checkpoint does not hold"):
        creds.check(tmp_path, spec())
    tax = bytes([0x07, 0, 0, 0, 0, 0, 0, 0]) + DENY_ALL  # BPF_MISC|BPF_TAX: not seccomp's
    write_seccomp(tmp_path, [tax])
    write_core(tmp_path, pid=1, uid=1000)
    with pytest.raises(FailedPrecondition, match=r"cannot be compared .*opcode 0x7"):
        creds.check(tmp_path, spec())


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: (d / "seccomp.img").write_bytes(b"\x19CVTI0Ad\xff\x00\x00\x00"), "truncated"),
    (lambda d: (d / "seccomp.img").write_bytes(b"garbage!" * 4), "not a CRIU seccomp image"),
    (lambda d: (d / "seccomp.img").symlink_to("/etc/passwd"), "not a regular file"),
    (lambda d: write_seccomp(d, [DENY_ALL, DENY_ALL], prevs=[1, 0]), "form a loop"),
    (lambda d: write_seccomp(d, [DENY_ALL], prevs=[5]), "names filter 5, which is not"),
    (lambda d: write_seccomp(d, [DENY_ALL] * 1025), "more than 1024 filters"),
    (lambda d: None, "names filter 0, which is not there"),  # no seccomp.img at all
])
def test_a_malformed_seccomp_image_is_invalid(tmp_path: Path, make: Any, message: str) -> None:
    write_core(tmp_path, uid=1000, seccomp_filter=None)  # no seccomp.img made here
    write_core(tmp_path, uid=1000, seccomp_filter=0, pid=2)
    (tmp_path / "seccomp.img").unlink(missing_ok=True)
    make(tmp_path)
    with pytest.raises(InvalidArgument, match=message):
        creds.check(tmp_path, spec())
