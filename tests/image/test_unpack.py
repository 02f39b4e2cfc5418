"""Layer unpack: metadata kept, whiteouts converted, hostile entries refused with nothing left."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pycri import errors
from pycri.image.unpack import HostileLayer, unpack_layer
from tests.lib import images
from tests.lib.images import Entry, directory, file, hardlink, opaque, symlink, whiteout
from tests.lib.trees import tree


def _unpack(tmp_path: Path, entries: list[Entry], comp: str = "gzip",
            diff: bool = True) -> Path:
    raw = images.tar_bytes(entries)
    blob = tmp_path / "blob"
    blob.write_bytes(images.compress(raw, comp))
    (tmp_path / "tmp").mkdir(exist_ok=True)
    dest = tmp_path / "layer"
    unpack_layer(blob, dest, tmp_path / "tmp", images.sha(raw) if diff else None)
    return dest


@pytest.mark.parametrize("comp", ["gzip", "zstd", "none"])
def test_metadata_kept(tmp_path: Path, comp: str) -> None:
    entries = [
        directory("d", 0o750, 12, 34),
        file("d/suid", "x", 0o4755, 0, 0),
        file("./d/owned", "y", 0o600, 1000, 1001),
        symlink("d/link", "/etc/passwd"),
        hardlink("d/hl", "d/owned"),
        Entry("d/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3),
        Entry("d/fifo", tarfile.FIFOTYPE, mode=0o644),
        Entry("d/x", xattrs={"user.pycri": "v"}, data=b"z"),
        whiteout("gone"), opaque("o"),
    ]
    dest = _unpack(tmp_path, entries, comp)
    st = os.lstat(dest / "d")
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o750, 12, 34)
    assert st.st_mtime == images.MTIME
    assert stat.S_IMODE(os.lstat(dest / "d/suid").st_mode) == 0o4755
    o = os.lstat(dest / "d/owned")
    assert (o.st_uid, o.st_gid, o.st_nlink) == (1000, 1001, 2)
    assert os.lstat(dest / "d/hl").st_ino == o.st_ino
    assert os.readlink(dest / "d/link") == "/etc/passwd"
    n = os.lstat(dest / "d/null")
    assert stat.S_ISCHR(n.st_mode) and os.major(n.st_rdev) == 1 and os.minor(n.st_rdev) == 3
    assert stat.S_ISFIFO(os.lstat(dest / "d/fifo").st_mode)
    assert os.getxattr(dest / "d/x", "user.pycri") == b"v"
    w = os.lstat(dest / "gone")
    assert stat.S_ISCHR(w.st_mode) and w.st_rdev == 0
    assert os.getxattr(dest / "o", "trusted.overlay.opaque") == b"y"
    assert not (dest / "o" / ".wh..wh..opq").exists()


@pytest.mark.parametrize(
    "entries",
    [
        [file("../evil", "x")],
        [file("a/../../evil", "x")],
        [file("/abs-evil", "x")],
        [symlink("esc", "../../"), file("esc/evil", "x")],
        [symlink("esc", "/"), directory("esc/sub")],
        [hardlink("hl", "../outside")],
        [hardlink("hl", "/etc/passwd")],
        [file("f", "x"), file("f/under-a-file", "x")],
        [Entry("x", xattrs={"trusted.overlay.redirect": "/etc"}, data=b"")],
        [whiteout("..")],
    ],
    ids=["dotdot", "nested-dotdot", "absolute", "symlink-file", "symlink-dir", "hardlink-dotdot",
         "hardlink-absolute", "through-file", "overlay-xattr", "whiteout-dotdot"],
)
def test_hostile_layer_refused_nothing_left(tmp_path: Path, entries: list[Entry]) -> None:
    with pytest.raises(HostileLayer):
        _unpack(tmp_path, [file("ok", "fine"), *entries])
    assert not (tmp_path / "layer").exists()
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / "evil").exists() and not (tmp_path / "outside").exists()
    assert not Path("/abs-evil").exists() and not Path("/evil").exists()


def test_wrong_diff_id_and_garbage(tmp_path: Path) -> None:
    raw = images.tar_bytes([file("a", "1")])
    blob = tmp_path / "blob"
    blob.write_bytes(images.compress(raw, "gzip"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(errors.InvalidArgument, match="hashes to"):
        unpack_layer(blob, tmp_path / "layer", tmp_path / "tmp", "sha256:" + "0" * 64)
    blob.write_bytes(b"\x1f\x8b" + b"garbage" * 100)
    with pytest.raises(errors.InvalidArgument, match="corrupt"):
        unpack_layer(blob, tmp_path / "layer", tmp_path / "tmp", None)
    assert not (tmp_path / "layer").exists() and list((tmp_path / "tmp").iterdir()) == []


def _damaged(gz: bytes, how: str) -> bytes:
    if how == "flipped":  # inside the deflate stream: the inflater's own error
        return gz[:12] + bytes([gz[12] ^ 0xFF]) + gz[13:]
    if how == "truncated":
        return gz[:len(gz) // 2]
    if how == "crc":
        return gz[:-8] + b"\x00" * 8
    return gz + b"\x00" * 512  # "padded": zeros after the stream are fine, as in gzip(1)


@pytest.mark.parametrize("how", ["flipped", "truncated", "crc", "padded"])
def test_a_damaged_gzip_stream_is_invalid_and_leaves_nothing(tmp_path: Path, how: str) -> None:
    """The gzip layers are inflated by zlib-ng (issue 40): each of its failures is the
    layer's InvalidArgument, as the stdlib's were."""
    raw = images.tar_bytes([file(f"f{i}", os.urandom(512).hex()) for i in range(20)])
    blob = tmp_path / "blob"
    blob.write_bytes(_damaged(images.compress(raw, "gzip"), how))
    (tmp_path / "tmp").mkdir()
    if how == "padded":
        unpack_layer(blob, tmp_path / "layer", tmp_path / "tmp", None)
        assert (tmp_path / "layer" / "f19").is_file()
        return
    with pytest.raises(errors.InvalidArgument, match="corrupt archive"):
        unpack_layer(blob, tmp_path / "layer", tmp_path / "tmp", None)
    assert not (tmp_path / "layer").exists() and list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME])
def test_oversized_extended_header_refused_before_it_is_read(tmp_path: Path, kind: bytes) -> None:
    # A header claiming 64 MiB of pax/long-name data: tarfile would read it all into memory.
    size = 64 << 20
    header = tarfile.TarInfo("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "pax")
    header.type, header.size = kind, size
    raw = header.tobuf(format=tarfile.GNU_FORMAT) + b"\0" * size + b"\0" * 1024
    blob = tmp_path / "blob"
    blob.write_bytes(images.compress(raw, "gzip"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(HostileLayer, match="extended tar header"):
        unpack_layer(blob, tmp_path / "layer", tmp_path / "tmp", None)
    assert not (tmp_path / "layer").exists() and list((tmp_path / "tmp").iterdir()) == []


# ---- the extractor against GNU tar ----------------------------------------------------

_NAMES = ("a", "b", "c")


@st.composite
def _archives(draw: st.DrawFn) -> list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]:
    """Archives GNU tar and the extractor must agree on: entries under declared
    directories, later files, symlinks and hard links replacing earlier non-directories,
    hard links to files named earlier; any mode, owner and time."""
    dirs: list[str] = [""]
    nondirs: dict[str, str] = {}  # path -> "file" | "sym" | "link"
    out: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]] = []
    for _ in range(draw(st.integers(1, 14))):
        parent = draw(st.sampled_from(dirs))
        name = f"{parent}/{draw(st.sampled_from(_NAMES))}".lstrip("/")
        if name in dirs:
            continue  # each directory is declared once
        kinds = ["file", "sym"] + (["link"] if any(k == "file" and p != name
                                                   for p, k in nondirs.items()) else [])
        if name not in nondirs:
            kinds.append("dir")
        kind = draw(st.sampled_from(kinds))
        ti = tarfile.TarInfo(name)
        ti.uid, ti.gid = draw(st.integers(0, 70000)), draw(st.integers(0, 70000))
        ti.mtime = draw(st.integers(0, 2**33))
        ti.mode = draw(st.integers(0, 0o7777))
        if kind == "dir":
            ti.type = tarfile.DIRTYPE
            dirs.append(name)
            out.append(ti)
        elif kind == "file":
            data = draw(st.binary(max_size=700))
            ti.size = len(data)
            nondirs[name] = "file"
            out.append((ti, data))
        elif kind == "sym":
            # Relative, inside: GNU tar makes a link out of the tree (absolute, or with
            # "..") only at its end, where a later entry of the same name has come.
            ti.type, ti.linkname = tarfile.SYMTYPE, draw(st.sampled_from(["x", "y/z", "a"]))
            nondirs[name] = "sym"
            out.append(ti)
        else:
            target = draw(st.sampled_from(sorted(p for p, k in nondirs.items()
                                                 if k == "file" and p != name)))
            ti.type, ti.linkname = tarfile.LNKTYPE, target
            nondirs[name] = "file"  # the same inode as its target: a file to link to
            out.append(ti)
    return out


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=_archives())
def test_the_same_tree_as_gnu_tar(tmp_path: Path, entries: list[
        tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> None:
    """The extractor's shortcuts (create first and clear on EEXIST, remembered
    directories, metadata through the fd) leave what `tar -x -p` leaves."""
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    blob = work / "layer.tar"
    with tarfile.open(blob, "w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            if isinstance(e, tuple):
                tf.addfile(e[0], io.BytesIO(e[1]))
            else:
                tf.addfile(e)
    (work / "tmp").mkdir()
    ours, theirs = work / "ours", work / "theirs"
    unpack_layer(blob, ours, work / "tmp", None)
    theirs.mkdir()
    subprocess.run(["tar", "-x", "-p", "--numeric-owner", "--same-owner", "-f", str(blob),
                    "-C", str(theirs)], check=True, capture_output=True)
    assert tree(ours) == tree(theirs)


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_sparse_files_come_out_whole(tmp_path: Path, fmt: str) -> None:
    """GNU tar's sparse members (old GNU headers, PAX 1.0 maps) are read through
    tarfile's map over the forward-only stream: the file comes out byte for byte."""
    src = tmp_path / "src"
    src.mkdir()
    sparse = src / "holes"
    with open(sparse, "wb") as f:
        f.truncate(6 << 20)
        f.seek(1 << 20)
        f.write(b"first" * 1000)
        f.seek(5 << 20)
        f.write(b"second" * 1000)
    (src / "after").write_bytes(b"the next member")
    blob = tmp_path / "layer.tar"
    subprocess.run(["tar", "--sparse", f"--format={fmt}", "-cf", str(blob), "-C", str(src),
                    "holes", "after"], check=True)
    (tmp_path / "tmp").mkdir()
    unpack_layer(blob, tmp_path / "layer", tmp_path / "tmp", images.sha(blob.read_bytes()))
    assert (tmp_path / "layer" / "holes").read_bytes() == sparse.read_bytes()
    assert (tmp_path / "layer" / "after").read_bytes() == b"the next member"


def test_members_read_are_not_kept(tmp_path: Path) -> None:
    """tarfile keeps every member it reads: 100,000 entries (opaque markers, which
    make nothing on disk) would hold ~60 MB of headers for the length of the unpack."""
    import tracemalloc

    marker = tarfile.TarInfo(".wh..wh..opq")
    block = marker.tobuf(format=tarfile.USTAR_FORMAT)
    blob = tmp_path / "layer.tar"
    blob.write_bytes(block * 100_000 + bytes(1024))
    (tmp_path / "tmp").mkdir()
    tracemalloc.start()
    try:
        unpack_layer(blob, tmp_path / "layer", tmp_path / "tmp", None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
