"""Checkpoint archives on disk (pycri/criu/archive.py): where they may be written and
read, that writing is all or nothing and bounded, that a hostile archive cannot write
outside its directory, and that a container's rootfs changes (an overlay upper dir with a
whiteout) replay into a new overlay as they were. Real files and real overlay mounts."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pycri.criu import archive
from pycri.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    d = tmp_path / "archives"
    d.mkdir()
    return d


def test_new_archives_only_inside_the_archive_dirs_and_never_over_a_file(
    tmp_path: Path, allowed: Path
) -> None:
    dirs = [str(allowed)]
    assert archive.new_archive(dirs, str(allowed / "a.tar"), "location") == allowed / "a.tar"
    with pytest.raises(InvalidArgument, match=r"location: .* is outside the checkpoint dir"):
        archive.new_archive(dirs, str(tmp_path / "a.tar"), "location")
    (allowed / "out").symlink_to(tmp_path)
    with pytest.raises(InvalidArgument, match="outside"):
        archive.new_archive(dirs, str(allowed / "out" / "a.tar"), "location")
    with pytest.raises(InvalidArgument, match="does not exist"):
        archive.new_archive(dirs, str(allowed / "sub" / "a.tar"), "location")
    (allowed / "taken.tar").write_text("x")
    with pytest.raises(AlreadyExists):
        archive.new_archive(dirs, str(allowed / "taken.tar"), "location")
    (allowed / "dangling").symlink_to(tmp_path / "nothing")
    with pytest.raises(AlreadyExists):  # a link is a file too: never written through
        archive.new_archive(dirs, str(allowed / "dangling"), "location")


def test_archives_read_are_regular_files_inside_the_archive_dirs(
    tmp_path: Path, allowed: Path
) -> None:
    dirs = [str(allowed)]
    with pytest.raises(NotFound):
        archive.existing_archive(dirs, str(allowed / "none.tar"), "image")
    (tmp_path / "secret").write_text("x")
    (allowed / "link.tar").symlink_to(tmp_path / "secret")
    with pytest.raises(InvalidArgument, match="not a regular file"):
        archive.existing_archive(dirs, str(allowed / "link.tar"), "image")
    with pytest.raises(InvalidArgument, match="outside"):
        archive.existing_archive(dirs, str(tmp_path / "secret"), "image")


def test_writing_is_all_or_nothing_within_the_limit(tmp_path: Path, allowed: Path) -> None:
    src = tmp_path / "src"
    (src / "checkpoint").mkdir(parents=True)
    (src / "checkpoint" / "pages-1.img").write_bytes(os.urandom(200_000))
    (src / "config.dump").write_text("{}")
    with pytest.raises(ResourceExhausted, match="max_archive_bytes"):
        archive.write_tar(allowed / "big.tar", src, 100_000)
    assert list(allowed.iterdir()) == []  # no partial file left
    archive.write_tar(allowed / "ok.tar", src, 1 << 20)
    with tarfile.open(allowed / "ok.tar") as tar:
        assert set(tar.getnames()) == {"checkpoint", "checkpoint/pages-1.img", "config.dump"}
    assert (allowed / "ok.tar").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in allowed.iterdir()] == ["ok.tar"]


# Run as nobody: lists the directory in a loop and opens every file in it, printing the
# name of each it could read, until a file named .stop appears.
PEEK = r"""
import os, sys
d = sys.argv[1]
print("ready", flush=True)
seen = set()
while ".stop" not in (names := os.listdir(d)):
    for n in set(names) - seen:
        try:
            with open(os.path.join(d, n), "rb") as f:
                f.read(1)
        except OSError:
            continue
        seen.add(n)
        print(n, flush=True)
"""


@pytest.fixture
def public() -> Iterator[Path]:
    """A directory anyone may list, as /var/lib/kubelet/checkpoints is (0755)."""
    d = Path(tempfile.mkdtemp(prefix="pycri-ckpt-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def test_nothing_written_is_readable_by_others_from_its_first_byte(
    tmp_path: Path, public: Path
) -> None:
    """Issue 22: the partial archive could be read by any user while it was written (it
    was made 0600 only before its rename). A process of nobody opens every file that
    appears while an archive and a metadata file are written; it must get none."""
    src = tmp_path / "src"
    (src / "checkpoint").mkdir(parents=True)
    (src / "checkpoint" / "pages-1.img").write_bytes(os.urandom(64 << 20))  # time to look
    peek = subprocess.Popen(["/usr/bin/python3", "-c", PEEK, str(public)], user=65534,
                            group=65534, extra_groups=[], stdout=subprocess.PIPE, text=True)
    try:
        assert peek.stdout is not None and peek.stdout.readline() == "ready\n"
        archive.write_json(public / "config.dump", {"secret": "x" * (1 << 20)})
        archive.write_tar(public / "a.tar", src, 1 << 30)
        archive.write_rootfs_diff(src, public, 1 << 30)
    finally:
        (public / ".stop").touch()
        out, _ = peek.communicate(timeout=60)
    assert out == "", f"read by nobody while written: {out.split()}"
    modes = {p.name: p.stat().st_mode & 0o777 for p in public.iterdir() if p.name != ".stop"}
    assert modes == {"config.dump": 0o600, "a.tar": 0o600, archive.ROOTFS_DIFF: 0o600}


def tar_with(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize(("bad", "message"), [
    (entry("../evil"), "leaves the archive"),
    (entry("checkpoint/../../evil"), "leaves the archive"),
    (entry("link", tarfile.SYMTYPE, "/etc"), "is not a regular file or directory"),
    (entry("hard", tarfile.LNKTYPE, "/etc/passwd"), "is not a regular file or directory"),
    (entry("dev", tarfile.CHRTYPE), "is not a regular file or directory"),
])
def test_a_hostile_archive_writes_nothing_outside(
    tmp_path: Path, bad: tarfile.TarInfo, message: str
) -> None:
    dest = tmp_path / "work" / "unpacked"
    dest.mkdir(parents=True)
    path = tar_with(tmp_path / "bad.tar", (entry("config.dump"), b"{}"), (bad, b"x"))
    with pytest.raises(InvalidArgument, match=message):
        archive.extract(path, dest, 1 << 20, "image")
    assert not (tmp_path / "work" / "evil").exists() and not (tmp_path / "evil").exists()


def test_an_archive_is_unpacked_within_its_limit(tmp_path: Path) -> None:
    dest = tmp_path / "unpacked"
    dest.mkdir()
    path = tar_with(tmp_path / "ok.tar", (entry(".", tarfile.DIRTYPE), b""),
                    (entry("./checkpoint", tarfile.DIRTYPE), b""),
                    (entry("./checkpoint/pages-1.img"), b"p" * 1000))
    with pytest.raises(ResourceExhausted):
        archive.extract(path, dest, 999, "image")
    dest2 = tmp_path / "unpacked2"
    dest2.mkdir()
    archive.extract(path, dest2, 1000, "image")
    assert (dest2 / "checkpoint" / "pages-1.img").read_bytes() == b"p" * 1000
    with pytest.raises(InvalidArgument, match="not a readable tar archive"):
        (tmp_path / "junk.tar").write_bytes(b"no tar here" * 100)
        archive.extract(tmp_path / "junk.tar", dest2, 1000, "image")


@contextlib.contextmanager
def overlay(lower: Path, d: Path) -> Iterator[tuple[Path, Path]]:
    """A real overlay like a container's rootfs: (merged, upper)."""
    upper, work, merged = d / "upper", d / "work", d / "merged"
    for p in (upper, work, merged):
        p.mkdir(parents=True)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)], check=True)
    try:
        yield merged, upper
    finally:
        subprocess.run(["umount", str(merged)], check=True)


def test_rootfs_changes_replay_into_a_new_overlay(tmp_path: Path) -> None:
    lower = tmp_path / "lower"
    (lower / "etc").mkdir(parents=True)
    (lower / "etc" / "keep").write_text("image")
    (lower / "etc" / "gone").write_text("image")
    (lower / "bin").mkdir()
    out = tmp_path / "layout"
    out.mkdir()
    with overlay(lower, tmp_path / "old") as (merged, upper):
        (merged / "etc" / "keep").write_text("changed")
        (merged / "etc" / "gone").unlink()
        (merged / "tmp").mkdir()
        (merged / "tmp" / "c").write_text("42")
        os.chmod(merged / "tmp" / "c", 0o4755)
        (merged / "bin" / "sh").symlink_to("/bin/busybox")
        archive.write_rootfs_diff(upper, out, 1 << 20)
    assert json.loads((out / archive.DELETED_FILES).read_text()) == ["/etc/gone"]
    with tarfile.open(out / archive.ROOTFS_DIFF) as tar:
        assert "etc/gone" not in tar.getnames()  # the whiteout is a deleted file instead
        assert {"etc/keep", "tmp/c", "bin/sh"} <= set(tar.getnames())

    with overlay(lower, tmp_path / "new") as (merged, _):
        archive.apply_rootfs_diff(out, merged, 1 << 20, "image")
        assert (merged / "etc" / "keep").read_text() == "changed"
        assert not (merged / "etc" / "gone").exists()
        assert (merged / "tmp" / "c").read_text() == "42"
        assert (merged / "tmp" / "c").stat().st_mode & 0o7777 == 0o4755  # its own mode
        assert os.readlink(merged / "bin" / "sh") == "/bin/busybox"


def test_rootfs_changes_cannot_reach_outside_the_rootfs(tmp_path: Path) -> None:
    rootfs, outside = tmp_path / "rootfs", tmp_path / "outside"
    rootfs.mkdir()
    outside.mkdir()
    (rootfs / "etc").symlink_to(outside)  # an image may hold such links
    src = tmp_path / "src"
    src.mkdir()
    tar_with(src / archive.ROOTFS_DIFF, (entry("etc/passwd"), b"root::0:0::/:/bin/sh"))
    with pytest.raises(InvalidArgument, match="cannot be applied"):
        archive.apply_rootfs_diff(src, rootfs, 1 << 20, "image")
    assert list(outside.iterdir()) == []

    (src / archive.ROOTFS_DIFF).unlink()
    (outside / "victim").write_text("x")
    for name in ("/etc/victim", "/../outside/victim"):
        (src / archive.DELETED_FILES).write_text(json.dumps([name]))
        with pytest.raises(InvalidArgument):
            archive.apply_rootfs_diff(src, rootfs, 1 << 20, "image")
    assert (outside / "victim").exists()


@pytest.mark.parametrize(("name", "message"), [
    ("x" * 5000, "longer than a path may be"),
    ("/".join(["d" * 30] * 200) + "/f", "longer than a path may be"),
    ("/".join(["d"] * 200) + "/f", "directories deep"),
])
def test_an_archive_with_names_past_the_limits_is_invalid(
    tmp_path: Path, name: str, message: str
) -> None:
    """Issue 22: a 5000-character name or 200 nested directories were INTERNAL (OSError:
    File name too long)."""
    dest = tmp_path / "unpacked"
    dest.mkdir()
    path = tar_with(tmp_path / "bad.tar", (entry(name), b"x"))
    with pytest.raises(InvalidArgument, match=message):
        archive.extract(path, dest, 1 << 20, "image")


def test_a_checkpoint_image_past_the_limits_is_invalid(tmp_path: Path) -> None:
    """The same limits for a layout copied out of an image, checked before going deeper."""
    view = tmp_path / "view"
    deep = view.joinpath(*["d"] * 50)
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    dest = tmp_path / "work"
    dest.mkdir()
    with pytest.raises(InvalidArgument, match="directories deep"):
        archive.copy_layout(view, dest, 1 << 20, "image")


@pytest.mark.parametrize(("text", "message"), [
    ("[" * 100_000 + "]" * 100_000, "nests deeper than"),
    ('{"a": ' * 40 + "1" + "}" * 40, "nests deeper than"),
    ('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}', None),  # brackets in a string
    ("{", "not valid JSON"),
    ("\udcff", "not valid JSON"),
])
def test_metadata_json_is_bounded(tmp_path: Path, text: str, message: str | None) -> None:
    """Issue 22: a pycri.container.json nested 100,000 deep was INTERNAL (RecursionError)."""
    path = tmp_path / "pycri.container.json"
    path.write_text(text, errors="surrogateescape")
    if message is None:
        assert archive.read_json(path, "image") == json.loads(text)
        return
    with pytest.raises(InvalidArgument, match=message):
        archive.read_json(path, "image")
    path.unlink()
    path.mkdir()
    with pytest.raises(InvalidArgument, match="not a regular file"):
        archive.read_json(path, "image")


_PARTS = st.sampled_from(["", ".", "..", "checkpoint", "a" * 255, "a" * 256, "x" * 5000,
                          "pages-1.img", "\udcff", "\x00", "-", "d"])
_MEMBERS = st.lists(st.tuples(
    st.lists(_PARTS, min_size=1, max_size=30).map("/".join),
    st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
                     tarfile.CHRTYPE, tarfile.FIFOTYPE]),
    st.binary(max_size=64)), max_size=12)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(members=_MEMBERS)
def test_fuzzed_archives_are_unpacked_or_invalid(tmp_path: Path, members: list[
        tuple[str, bytes, bytes]]) -> None:
    """Any tar at all: unpacked inside its directory, or InvalidArgument/ResourceExhausted;
    never another error, never a file outside."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    dest = root / "work" / "unpacked"
    dest.mkdir(parents=True)
    path = root / "fuzz.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in members:
            info = entry(name, kind, "../../outside")
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    with contextlib.suppress(InvalidArgument, ResourceExhausted):
        archive.extract(path, dest, 256, "image")
    assert sorted(p.name for p in root.iterdir()) == ["fuzz.tar", "work"]
    assert [p.name for p in (root / "work").iterdir()] == ["unpacked"]


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.recursive(st.sampled_from(["1", '"["', '"\\""', "null", "[", "{", "}", "]"]),
                         lambda inner: st.lists(inner, max_size=6).map("".join), max_leaves=80)
       | st.integers(0, 200).map(lambda n: "[" * n + "]" * n))
def test_fuzzed_metadata_is_read_or_invalid(tmp_path: Path, text: str) -> None:
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "pycri.container.json"
    path.write_text(text)
    with contextlib.suppress(InvalidArgument):
        archive.read_json(path, "image")
