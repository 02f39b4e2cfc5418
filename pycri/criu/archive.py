"""Checkpoint archives on disk: where they may be, what they hold, and moving files in and out.

A container's archive is an uncompressed tar in the layout CRI-O and containerd write and
`checkpointctl` reads: `checkpoint/` (CRIU's image files), `config.dump` (who the
container was), `spec.dump` (its OCI spec), `rootfs-diff.tar` (the files it changed in
its image) and `deleted.files` (those it deleted), with CRIU's `dump.log` and
containerd's `status`. pycri adds
`pycri.container.json`, the CRI ContainerConfig it restores from. A pod's archive holds
`pod.dump`, `pod.options` (its containers) and one container layout per directory.

Requests name these files and the daemon runs as root, so every path is checked against
`checkpoint.archive_dirs`, a new archive never replaces a file, and reading one is
bounded (bytes, entries, name lengths, depth, JSON size and nesting) and takes only
directories and regular files: whatever it holds, a bad archive is InvalidArgument.
What it holds is a container's memory, so every file written here is 0600 from its
first byte. Everything here is blocking file work: callers run it in a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import stat
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO, cast

from pycri import boundedjson
from pycri.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted

CHECKPOINT_DIR = "checkpoint"
CONFIG_DUMP = "config.dump"
SPEC_DUMP = "spec.dump"
ROOTFS_DIFF = "rootfs-diff.tar"
DELETED_FILES = "deleted.files"
STATUS = "status"  # containerd's: older checkpointctl reads the creation time there
CONTAINER_DUMP = "pycri.container.json"
POD_DUMP = "pod.dump"
POD_OPTIONS = "pod.options"
MAX_ENTRIES = 200_000  # tar members read from one archive (CRIU writes a few per process)
MAX_JSON = 16 << 20  # bytes of one metadata file
MAX_JSON_DEPTH = 32  # nesting of one metadata file (a ContainerConfig has about 6)
NAME_MAX = 255  # bytes of one path component, and of a whole path: the kernel's limits
PATH_MAX = 4096
# Directories deep in a layout (<container>/checkpoint/<file> in a pod archive); a
# container's own deep paths are inside rootfs-diff.tar, applied separately.
MAX_DEPTH = 8


def _inside(path: Path, dirs: Iterable[str]) -> bool:
    for d in dirs:
        real = Path(os.path.realpath(d))
        if path == real or path.is_relative_to(real):
            return True
    return False


def _checked(dirs: list[str], path: str, what: str) -> Path:
    """`path` with its directory resolved, refused unless that lies in `dirs`."""
    p = Path(path)
    parent = Path(os.path.realpath(p.parent))
    if not _inside(parent, dirs):
        raise InvalidArgument(f"{what}: {path} is outside the checkpoint directories "
                              f"({', '.join(dirs) or 'none'}; checkpoint.archive_dirs)")
    if not parent.is_dir():
        raise InvalidArgument(f"{what}: directory {p.parent} does not exist")
    return parent / p.name


def new_archive(dirs: list[str], path: str, what: str) -> Path:
    """Where a new archive may be written: inside `dirs`, and not there yet."""
    target = _checked(dirs, path, what)
    if os.path.lexists(target):
        raise AlreadyExists(f"{what}: {path} already exists")
    return target


def existing_archive(dirs: list[str], path: str, what: str) -> Path:
    """An archive to read: a regular file (not a link) inside `dirs`."""
    target = _checked(dirs, path, what)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        raise NotFound(f"{what}: checkpoint archive {path} not found") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidArgument(f"{what}: {path} is not a regular file")
    return target


class _Bounded:
    """A write-only file that refuses to grow past `limit` bytes (tarfile's stream mode
    only writes)."""

    def __init__(self, f: BinaryIO, limit: int, what: str) -> None:
        self.f, self.left, self.what = f, limit, what

    def write(self, data: bytes) -> int:
        self.left -= len(data)
        if self.left < 0:
            raise ResourceExhausted(f"{self.what} would exceed checkpoint.max_archive_bytes")
        return self.f.write(data)


def _create(path: Path) -> BinaryIO:
    """A new file, never one already there nor through a link, private (0600) from its
    first byte: it holds a container's memory or files, whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    return os.fdopen(fd, "wb")


def _tar_stream(out: _Bounded) -> tarfile.TarFile:
    return tarfile.open(fileobj=cast(BinaryIO, out), mode="w|", format=tarfile.PAX_FORMAT)


@contextlib.contextmanager
def _disk_full_is_exhaustion(what: str) -> Any:
    try:
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ResourceExhausted(f"{what}: no space left on the device") from None
        raise


def write_tar(dest: Path, src: Path, limit: int) -> None:
    """Tar the entries of the directory `src` into the new file `dest`, within `limit`
    bytes. It appears complete or not at all: written aside, fsynced, then linked in
    (which fails rather than replace a file that appeared meanwhile)."""
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.partial")
    try:
        with _disk_full_is_exhaustion(str(dest)):
            with _create(tmp) as f:
                with _tar_stream(_Bounded(f, limit, str(dest))) as tar:
                    for name in sorted(os.listdir(src)):
                        tar.add(src / name, arcname=name)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, dest)
            except FileExistsError:
                raise AlreadyExists(f"{dest} appeared while the archive was written") from None
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, doc: Any) -> None:
    with _create(path) as f:
        f.write(json.dumps(doc, indent=2).encode())


def read_json(path: Path, what: str) -> Any:
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgument(f"{what}: {path.name} is not a regular file")
        if st.st_size > MAX_JSON:
            raise InvalidArgument(f"{what}: {path.name} is larger than {MAX_JSON} bytes")
        text = path.read_text()
        if boundedjson.nesting(text, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
            raise InvalidArgument(f"{what}: {path.name} nests deeper than {MAX_JSON_DEPTH} "
                                  "levels")
        return json.loads(text)
    except FileNotFoundError:
        raise InvalidArgument(f"{what}: the archive has no {path.name}") from None
    except ValueError as e:
        raise InvalidArgument(f"{what}: {path.name} is not valid JSON: {e}") from None


def _is_whiteout(st: os.stat_result) -> bool:
    """overlayfs records a deleted lower file as a 0:0 character device in the upper dir."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def write_rootfs_diff(upper: Path, out: Path, limit: int) -> int:
    """The container's changes to its image, from its overlay upper dir: what it wrote
    into `out/rootfs-diff.tar`, what it deleted (whiteouts) into `out/deleted.files`.
    Returns the bytes written."""
    deleted: list[str] = []
    with _disk_full_is_exhaustion(str(out / ROOTFS_DIFF)), _create(out / ROOTFS_DIFF) as f:
        bounded = _Bounded(f, limit, ROOTFS_DIFF)
        with _tar_stream(bounded) as tar:
            for dirpath, dirnames, filenames in os.walk(upper):
                dirnames.sort()
                rel = Path(dirpath).relative_to(upper)
                for name in [*dirnames, *sorted(filenames)]:
                    path = Path(dirpath) / name
                    if _is_whiteout(os.lstat(path)):
                        deleted.append(str("/" / rel / name))
                    else:
                        tar.add(path, arcname=str(rel / name), recursive=False)
        written = limit - bounded.left
    if deleted:
        write_json(out / DELETED_FILES, deleted)
    return written


def _shown(name: str) -> str:
    return repr(name) if len(name) <= 100 else repr(name[:100]) + "…"


def _member_path(dest: Path, name: str, what: str, max_depth: int = PATH_MAX) -> Path:
    """`name` inside `dest`, refused (InvalidArgument) if it leaves it or passes the
    kernel's name limits or `max_depth` directories."""
    parts = Path(name.lstrip("/")).parts
    if not parts or any(p in ("..", "") for p in parts) or "\x00" in name:
        raise InvalidArgument(f"{what}: archive entry {_shown(name)} leaves the archive")
    if len(os.fsencode(name)) > PATH_MAX or any(len(os.fsencode(p)) > NAME_MAX for p in parts):
        raise InvalidArgument(f"{what}: archive entry {_shown(name)} is longer than a path "
                              f"may be ({NAME_MAX} bytes a component, {PATH_MAX} in all)")
    if len(parts) > max_depth:
        raise InvalidArgument(f"{what}: archive entry {_shown(name)} is more than "
                              f"{max_depth} directories deep")
    return dest.joinpath(*parts)


@contextlib.contextmanager
def _bad_input_is_invalid(what: str, source: object) -> Any:
    """File errors while unpacking come from what the archive holds (a path too long
    once under the work dir, say): InvalidArgument, except a full disk."""
    try:
        yield
    except FileExistsError as e:
        raise InvalidArgument(f"{what}: {e.filename} appears twice in {source}") from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ResourceExhausted(f"{what}: no space left on the device") from None
        raise InvalidArgument(f"{what}: {source} cannot be unpacked: {e}") from None


def extract(archive: Path, dest: Path, limit: int, what: str) -> None:
    """Unpack a checkpoint archive into the empty directory `dest`: only directories and
    regular files (CRIU's images and the metadata are nothing else), at most `limit`
    bytes and MAX_ENTRIES entries. Links are refused, so nothing written can land
    outside `dest`."""
    total = 0
    try:
        with _bad_input_is_invalid(what, archive), tarfile.open(archive, "r:*") as tar:
            for n, m in enumerate(tar):
                if n >= MAX_ENTRIES:
                    raise InvalidArgument(f"{what}: more than {MAX_ENTRIES} archive entries")
                if m.isdir() and not Path(m.name.lstrip("/")).parts:  # "./" of `tar -C dir .`
                    continue
                path = _member_path(dest, m.name, what, MAX_DEPTH)
                if m.isdir():
                    path.mkdir(mode=0o700, parents=True, exist_ok=True)
                    continue
                if not m.isreg():
                    raise InvalidArgument(f"{what}: archive entry {m.name!r} is not a regular "
                                          "file or directory")
                total += m.size
                if total > limit:
                    raise ResourceExhausted(f"{what}: the archive unpacks to more than "
                                            "checkpoint.max_archive_bytes")
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                src = tar.extractfile(m)
                assert src is not None  # a regular file
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with src, os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(src, out)
    except tarfile.TarError as e:
        raise InvalidArgument(f"{what}: {archive} is not a readable tar archive: {e}") from None


def copy_layout(src: Path, dest: Path, limit: int, what: str) -> None:
    """Copy a checkpoint layout held in an image (a mounted view) into `dest`, under the
    same rules as `extract`: directories and regular files only, at most `limit` bytes,
    names and depth bounded (checked before the walk goes deeper)."""
    total = 0
    with _bad_input_is_invalid(what, "the image's checkpoint"):
        for dirpath, dirnames, filenames in os.walk(src):
            rel = Path(dirpath).relative_to(src)
            for name in [*dirnames, *filenames]:
                _member_path(dest, str(rel / name), what, MAX_DEPTH)
                st = os.lstat(Path(dirpath) / name)
                if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                    raise InvalidArgument(f"{what}: {_shown(str(rel / name))} in the image is "
                                          "not a regular file or directory")
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
                if total > limit:
                    raise ResourceExhausted(f"{what}: the image's checkpoint is larger than "
                                            "checkpoint.max_archive_bytes")
            (dest / rel).mkdir(mode=0o700, exist_ok=True)
            for name in filenames:
                with open(Path(dirpath) / name, "rb") as f, _create(dest / rel / name) as out:
                    shutil.copyfileobj(f, out)


def _rootfs_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's "tar" filter (no absolute names, nothing resolving outside the rootfs,
    links included), keeping the files' own modes: they are the container's."""
    filtered = tarfile.tar_filter(member, dest)
    return filtered.replace(mode=member.mode, deep=False)


def apply_rootfs_diff(src: Path, rootfs: Path, limit: int, what: str) -> None:
    """Replay a container's changes into a new container's (mounted) rootfs: the files
    of rootfs-diff.tar written through the overlay, then the deleted files removed."""
    diff = src / ROOTFS_DIFF
    if diff.is_file():
        try:
            with tarfile.open(diff, "r:") as tar:
                members = tar.getmembers()
                if len(members) > MAX_ENTRIES:
                    raise InvalidArgument(f"{what}: {ROOTFS_DIFF} has more than {MAX_ENTRIES} "
                                          "entries")
                if sum(m.size for m in members) > limit:
                    raise ResourceExhausted(f"{what}: {ROOTFS_DIFF} unpacks to more than "
                                            "checkpoint.max_archive_bytes")
                tar.extractall(rootfs, members=members, filter=_rootfs_filter)
        except (tarfile.TarError, OSError) as e:
            raise InvalidArgument(f"{what}: {ROOTFS_DIFF} cannot be applied: {e}") from None
    if (src / DELETED_FILES).is_file():
        deleted = read_json(src / DELETED_FILES, what)
        if not isinstance(deleted, list) or not all(isinstance(p, str) for p in deleted):
            raise InvalidArgument(f"{what}: {DELETED_FILES} is not a list of paths")
        with _bad_input_is_invalid(what, DELETED_FILES):
            for name in deleted:
                _remove_in(rootfs, name, what)


def _remove_in(rootfs: Path, name: str, what: str) -> None:
    """Delete `name` inside `rootfs`, never through a link pointing out of it."""
    path = _member_path(rootfs, name, what)
    parent = Path(os.path.realpath(path.parent))
    real_root = Path(os.path.realpath(rootfs))
    if not (parent == real_root or parent.is_relative_to(real_root)):
        raise InvalidArgument(f"{what}: deleted file {name!r} resolves outside the rootfs")
    target = parent / path.name
    try:
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
    except FileNotFoundError:
        pass


def size_of(root: Path) -> int:
    """Bytes of the regular files under `root` (CRIU's images, before they are archived)."""
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(Path(dirpath) / name).st_size
    return total
