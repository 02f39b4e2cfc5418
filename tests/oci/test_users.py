"""users.py: passwd/group parsing, every USER form, group policies, rootfs reads."""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from pycri.errors import InvalidArgument
from pycri.oci.users import (
    ResolvedUser,
    UserRequest,
    parse_group,
    parse_passwd,
    read_rootfs_file,
    resolve_user,
    resolve_user_in_rootfs,
)

PASSWD = """\
root:x:0:0:root:/root:/bin/sh
# a comment
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
alice:x:1000:1001:Alice:/home/alice:/bin/sh
broken line
bob:x:notanumber:5::/:/bin/sh
nohome:x:1002:1002::
"""
GROUP = """\
root:x:0:
daemon:x:1:
alicegrp:x:1001:
wheel:x:10:alice,daemon
audio:x:29:bob,alice
bad:x:zz:alice
"""


def resolve(**kw: object) -> ResolvedUser:
    return resolve_user(UserRequest(**kw), PASSWD, GROUP)  # type: ignore[arg-type]


def test_parse_passwd_skips_malformed() -> None:
    users = parse_passwd(PASSWD)
    assert [u.name for u in users] == ["root", "daemon", "alice", "nohome"]
    alice = users[2]
    assert (alice.uid, alice.gid, alice.home) == (1000, 1001, "/home/alice")
    assert users[3].home == "/"


def test_parse_group_members() -> None:
    groups = parse_group(GROUP)
    assert [g.name for g in groups] == ["root", "daemon", "alicegrp", "wheel", "audio"]
    assert groups[3].members == ("alice", "daemon")
    assert groups[0].members == ()


def test_default_is_root_with_root_groups() -> None:
    u = resolve()
    assert (u.uid, u.gid, u.additional_gids, u.username) == (0, 0, (0,), "root")


def test_image_user_name() -> None:
    u = resolve(image_user="alice")
    assert (u.uid, u.gid) == (1000, 1001)
    assert u.additional_gids == (1001, 10, 29)
    assert u.home == "/home/alice"


def test_image_user_uid_known_and_unknown() -> None:
    assert resolve(image_user="1000").gid == 1001
    u = resolve(image_user="4242")
    assert (u.uid, u.gid, u.additional_gids, u.username) == (4242, 0, (0,), "")


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("1000:10", (1000, 10)),
        ("alice:wheel", (1000, 10)),
        ("1000:wheel", (1000, 10)),
        ("alice:29", (1000, 29)),
        ("4242:4343", (4242, 4343)),
    ],
)
def test_image_user_with_group(user: str, expected: tuple[int, int]) -> None:
    u = resolve(image_user=user)
    assert (u.uid, u.gid) == expected
    assert u.additional_gids[0] == expected[1]


def test_group_from_file_members_kept_with_explicit_group() -> None:
    assert resolve(image_user="alice:29").additional_gids == (29, 10)


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ("nobody", "user 'nobody' not found"),
        ("nobody:0", "user 'nobody' not found"),
        ("alice:nogroup", "group 'nogroup' not found"),
        ("alice:", "empty group"),
    ],
)
def test_unresolvable_names_are_invalid(user: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        resolve(image_user=user)


def test_run_as_user_beats_username_and_image() -> None:
    u = resolve(run_as_user=1, run_as_username="alice", image_user="alice")
    assert (u.uid, u.gid, u.username) == (1, 1, "daemon")
    assert u.additional_gids == (1, 10)


def test_run_as_username_beats_image() -> None:
    u = resolve(run_as_username="alice", image_user="daemon")
    assert u.uid == 1000


def test_run_as_username_missing() -> None:
    with pytest.raises(InvalidArgument, match="'carol'"):
        resolve(run_as_username="carol")


def test_run_as_group_overrides() -> None:
    u = resolve(run_as_user=1000, run_as_group=5)
    assert (u.uid, u.gid) == (1000, 5)
    assert u.additional_gids == (5, 10, 29)
    assert resolve(run_as_username="alice", run_as_group=7).gid == 7


def test_run_as_group_without_user_is_refused() -> None:
    # critest: "should return error if RunAsGroup is set without RunAsUser".
    with pytest.raises(InvalidArgument, match="run_as_group is set without"):
        resolve(image_user="alice:wheel", run_as_group=7)


def test_run_as_user_unknown_uid_gets_gid_zero() -> None:
    u = resolve(run_as_user=5555)
    assert (u.uid, u.gid, u.additional_gids) == (5555, 0, (0,))


def test_negative_ids_rejected() -> None:
    for kw in ({"run_as_user": -1}, {"run_as_user": 1, "run_as_group": -3},
               {"supplemental_groups": [-2]}):
        with pytest.raises(InvalidArgument, match="negative"):
            resolve(**kw)


def test_merge_policy_adds_file_groups_and_given() -> None:
    u = resolve(image_user="alice", supplemental_groups=[500, 10])
    assert u.additional_gids == (1001, 10, 29, 500)


def test_strict_policy_only_primary_and_given() -> None:
    u = resolve(image_user="alice", supplemental_groups=[500], strict_groups=True)
    assert u.additional_gids == (1001, 500)


def test_empty_files_numeric_ok_names_fail() -> None:
    assert resolve_user(UserRequest(run_as_user=7), "", "").additional_gids == (0,)
    with pytest.raises(InvalidArgument):
        resolve_user(UserRequest(image_user="root"), "", "")


# ---- reading the image's files without leaving the rootfs


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text(PASSWD)
    (root / "etc" / "group").write_text(GROUP)
    return root


def test_resolve_user_in_rootfs(rootfs: Path) -> None:
    u = resolve_user_in_rootfs(str(rootfs), UserRequest(image_user="alice"))
    assert (u.uid, u.gid, u.additional_gids) == (1000, 1001, (1001, 10, 29))


def test_missing_files_read_as_empty(tmp_path: Path) -> None:
    assert read_rootfs_file(str(tmp_path), "/etc/passwd") == ""
    u = resolve_user_in_rootfs(str(tmp_path), UserRequest(image_user="12:34"))
    assert (u.uid, u.gid) == (12, 34)


def test_absolute_symlink_stays_in_rootfs(rootfs: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("evil:x:0:0::/:/bin/sh\n")
    (rootfs / "etc" / "passwd").unlink()
    # Absolute target: must be read as <rootfs>/<outside>/secret, which does not exist.
    os.symlink(str(outside / "secret"), rootfs / "etc" / "passwd")
    assert read_rootfs_file(str(rootfs), "/etc/passwd") == ""
    # The same path inside the rootfs is what gets read.
    inner = rootfs / str(outside).lstrip("/")
    inner.mkdir(parents=True)
    (inner / "secret").write_text("inside:x:3:3::/:/bin/sh\n")
    assert read_rootfs_file(str(rootfs), "/etc/passwd").startswith("inside:")


def test_dotdot_symlink_clamped_at_root(rootfs: Path, tmp_path: Path) -> None:
    (tmp_path / "passwd").write_text("evil:x:0:0::/:/bin/sh\n")
    (rootfs / "etc" / "passwd").unlink()
    os.symlink("../../../../passwd", rootfs / "etc" / "passwd")
    assert read_rootfs_file(str(rootfs), "/etc/passwd") == ""
    (rootfs / "passwd").write_text("ok:x:1:1::/:/bin/sh\n")
    assert read_rootfs_file(str(rootfs), "/etc/passwd").startswith("ok:")


def test_symlinked_directory_component(rootfs: Path, tmp_path: Path) -> None:
    (rootfs / "real").mkdir()
    (rootfs / "real" / "group").write_text("g:x:9:\n")
    os.rename(rootfs / "etc", rootfs / "etc.old")
    os.symlink("/real", rootfs / "etc")
    assert read_rootfs_file(str(rootfs), "/etc/group") == "g:x:9:\n"


def test_symlink_loop_is_an_error(rootfs: Path) -> None:
    (rootfs / "etc" / "passwd").unlink()
    os.symlink("/etc/passwd", rootfs / "etc" / "passwd")
    with pytest.raises(InvalidArgument, match="too many levels of symlinks"):
        read_rootfs_file(str(rootfs), "/etc/passwd")


def test_non_regular_file_rejected(rootfs: Path) -> None:
    (rootfs / "etc" / "passwd").unlink()
    (rootfs / "etc" / "passwd").mkdir()
    with pytest.raises(InvalidArgument, match="is a directory, not a regular file"):
        read_rootfs_file(str(rootfs), "/etc/passwd")


def _opens_of(path: Path) -> Callable[[], int]:
    """Count IN_OPEN events on `path` (inotify sees an open of a device node's inode)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0 and libc.inotify_add_watch(fd, bytes(path), 0x20) >= 0  # IN_OPEN

    def count() -> int:
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            data = b""
        finally:
            os.close(fd)
        return len(data) // 16  # one event without a name is 16 bytes

    return count


@pytest.mark.parametrize("make, what", [
    (lambda p: os.mknod(p, 0o644 | stat.S_IFCHR, os.makedev(1, 3)), "character device"),
    (lambda p: os.mkfifo(p), "FIFO"),
])
def test_device_or_fifo_passwd_is_never_opened(
    rootfs: Path, make: Callable[[Path], None], what: str
) -> None:
    """Issue 8 defect 9: /etc/passwd as char device 1:3 was opened before its type was checked."""
    passwd = rootfs / "etc" / "passwd"
    passwd.unlink()
    make(passwd)
    opens = _opens_of(passwd)
    with pytest.raises(InvalidArgument) as refused:
        resolve_user_in_rootfs(str(rootfs), UserRequest(image_user="alice"))
    assert opens() == 0
    assert f"/etc/passwd in the image is a {what}, not a regular file" in str(refused.value)


def test_oversized_file_rejected(rootfs: Path) -> None:
    with open(rootfs / "etc" / "group", "wb") as f:
        f.truncate((4 << 20) + 10)
    with pytest.raises(InvalidArgument, match="larger than"):
        read_rootfs_file(str(rootfs), "/etc/group")
