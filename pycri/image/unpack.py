"""Layer unpack: a compressed tar stream -> one directory ready to be an overlay lowerdir.

Runs in a worker thread and streams (tarfile stream mode over a decompressing,
hashing reader), so a layer is never held in memory. OCI whiteouts become
overlayfs whiteouts. Every entry is placed by walking its parents with lstat,
never following a symlink, so nothing can land outside the layer; anything
that tries is refused, and since unpacking happens in a temp dir renamed into
place at the end, a refused layer leaves nothing behind. What a layer may
write is bounded (a `Bound`), counted both as the decompressed stream and as
the file sizes it declares, so a decompression bomb stops at the bound.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import logging
import math
import os
import shutil
import stat
import tarfile
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, cast

from pycri import errors
from pycri.image.types import MAX_ID

log = logging.getLogger("pycri.image.unpack")

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
OPAQUE_XATTR = "trusted.overlay.opaque"
XATTR_PAX = "SCHILY.xattr."  # a pax header key naming an xattr
BUF = 1 << 20
# Directories an unpack remembers having walked (see _Extractor): a bound on its memory.
MAX_KNOWN_DIRS = 1 << 16


class HostileLayer(errors.InvalidArgument):
    """A layer entry would be written outside the layer or is otherwise unsafe."""


@dataclass
class Bound:
    """At most `limit` bytes of unpacked content. `why` names the setting behind the
    limit for the error message; `exhausted` says the limit is the disk's free space
    (ResourceExhausted) rather than a bound on the layer itself (InvalidArgument)."""

    limit: int
    why: str
    exhausted: bool = False
    spent: int = field(default=0, init=False)

    def spend(self, n: int, what: str) -> None:
        self.spent += n
        if self.spent > self.limit:
            cls = errors.ResourceExhausted if self.exhausted else HostileLayer
            raise cls(f"{what}: unpacks to more than {self.limit} bytes ({self.why})")


class _HashingReader:
    """Hashes and counts everything read through it (the layer's diff ID)."""

    def __init__(self, f: IO[bytes], bound: Bound, what: str) -> None:
        self._f = f
        self._bound = bound
        self._what = what
        self.hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._bound.spend(len(data), self._what)
        self.hash.update(data)
        return data

    def drain(self) -> None:
        while self.read(BUF):
            pass


class Source(Protocol):
    """What a layer is read from: its blob file, or the Pipe from its download."""

    def read(self, n: int = -1, /) -> bytes: ...

    def readinto(self, buf: memoryview | bytearray, /) -> int: ...


class _Prefixed:
    """`head` (the bytes read to pick the decompressor), then the rest of `raw`."""

    def __init__(self, head: bytes, raw: Source) -> None:
        self._head, self._raw = head, raw

    def read(self, n: int = -1) -> bytes:
        if not self._head:
            return self._raw.read(n)
        if n < 0:
            out, self._head = self._head + self._raw.read(), b""
        else:
            out, self._head = self._head[:n], self._head[n:]
        return out

    def readinto(self, buf: memoryview | bytearray) -> int:
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)


def _read_exactly(raw: Source, n: int) -> bytes:
    """Up to `n` bytes, fewer only at the end (a pipe may hand them over in pieces)."""
    out = b""
    while len(out) < n:
        more = raw.read(n - len(out))
        if not more:
            break
        out += more
    return out


def _decompressing(source: Source) -> IO[bytes]:
    """Pick the decompressor from the magic bytes, whatever the media type claimed."""
    head = _read_exactly(source, 4)
    raw = cast(IO[bytes], _Prefixed(head, source))
    if head[:2] == b"\x1f\x8b":
        # zlib-ng inflates at about twice the stdlib's speed (docs/benchmarks.md, issue
        # 40); same file format, same errors (gzip.BadGzipFile, EOFError).
        from zlib_ng import gzip_ng  # loaded on the first gzip layer

        return gzip_ng.GzipNGFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if head == b"\x28\xb5\x2f\xfd":
        import zstandard  # unpack_layer's import: already loaded

        return zstandard.ZstdDecompressor().stream_reader(raw, read_size=BUF)
    return raw


# What the kernel and the filesystems take (limits.h, xattr.h, kdev_t.h): an entry past
# any of them is refused before anything of it is made, so an unpack never fails half-way
# on a value the platform cannot hold.
NAME_MAX, PATH_MAX = 255, 4096
XATTR_NAME_MAX, XATTR_SIZE_MAX = 255, 65536
MAX_DEV_MAJOR, MAX_DEV_MINOR = (1 << 12) - 1, (1 << 20) - 1
# Times every filesystem pycri unpacks onto holds: 2^34 s either side of 1970.
MAX_TIME = 1 << 34
# What the kernel answers for a value in an entry it will not take: the layer's doing.
_REFUSALS = frozenset({errno.ENAMETOOLONG, errno.EINVAL, errno.ELOOP, errno.EOVERFLOW,
                       errno.ERANGE, errno.E2BIG})


def check_header(m: tarfile.TarInfo, what: str) -> None:
    """HostileLayer naming the layer (`what`) and the entry, for a header value the
    kernel or the platform cannot take: a NUL in a name, a name component over 255
    bytes, a path or link target over 4096, an empty symlink target, a uid or gid out of
    range, a time that is not finite or out of range, an xattr name with a NUL, empty or
    over 255 bytes, an xattr value over 64 KiB, device numbers out of range."""
    def refuse(why: str) -> HostileLayer:
        return HostileLayer(f"{what}: layer entry {_shown(m.name)}: {why}")

    name = os.fsencode(m.name)
    if b"\0" in name:
        raise refuse("a NUL byte in its name")
    if len(name) > PATH_MAX:
        raise refuse(f"a path of {len(name)} bytes (limit {PATH_MAX})")
    longest = max(len(c) for c in name.split(b"/"))
    if longest > NAME_MAX:
        raise refuse(f"a name component of {longest} bytes (limit {NAME_MAX})")
    if m.issym() or m.islnk():
        link = os.fsencode(m.linkname)
        if b"\0" in link or len(link) > PATH_MAX or not link:
            raise refuse(f"a link target of {len(link)} bytes (1 to {PATH_MAX}, no NUL byte)")
        longest = max(len(c) for c in link.split(b"/"))
        if m.islnk() and longest > NAME_MAX:  # a path in the layer (a symlink's is text)
            raise refuse(f"a link target component of {longest} bytes (limit {NAME_MAX})")
    for field_name in ("uid", "gid"):
        value = getattr(m, field_name)
        if not isinstance(value, int) or not 0 <= value <= MAX_ID:
            raise refuse(f"{field_name} {value!r} is out of range (0-{MAX_ID})")
    if not isinstance(m.mtime, (int, float)) or not math.isfinite(m.mtime) \
            or abs(m.mtime) >= MAX_TIME:
        raise refuse(f"mtime {m.mtime!r} is not a time a filesystem holds")
    if (m.ischr() or m.isblk()) and not (
            0 <= m.devmajor <= MAX_DEV_MAJOR and 0 <= m.devminor <= MAX_DEV_MINOR):
        raise refuse(f"device {m.devmajor}:{m.devminor} is out of range")
    for key, value in m.pax_headers.items():
        if not key.startswith(XATTR_PAX):
            continue
        xname = key[len(XATTR_PAX):].encode("utf-8", "surrogateescape")
        if not xname or b"\0" in xname or len(xname) > XATTR_NAME_MAX:
            raise refuse(f"an xattr name of {len(xname)} bytes (1 to {XATTR_NAME_MAX}, no NUL "
                         "byte)")
        if len(value.encode("utf-8", "surrogateescape")) > XATTR_SIZE_MAX:
            raise refuse(f"an xattr value over {XATTR_SIZE_MAX} bytes")


def _shown(name: str) -> str:
    """An entry's name as an error shows it: at most 80 characters of its repr."""
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."


def _parts(name: str, what: str) -> list[str]:
    if name.startswith("/"):
        raise HostileLayer(f"layer entry {what} {name!r}: absolute path refused")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise HostileLayer(f"layer entry {what} {name!r}: '..' refused (would leave the layer)")
    return parts


class _TarStream:
    """The decompressed layer as tarfile reads it: forward only, with `tell` and a
    forward `seek`. tarfile's own stream mode ("r|") copies what is left of its buffer
    on every read, a megabyte per 512-byte header: a fifth of a pull's CPU on a layer
    of small files (perf, issue 40). Here each byte is copied once out of the chunk it
    came in."""

    def __init__(self, reader: _HashingReader) -> None:
        self._reader = reader
        self._buf = b""
        self._at = 0  # of _buf, what is read already
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            raise ValueError("a layer is read in bounded pieces")
        if len(self._buf) - self._at >= n:
            out = self._buf[self._at : self._at + n]
            self._at += n
        else:
            parts = [self._buf[self._at :]]
            have = len(parts[0])
            while have < n and (more := self._reader.read(BUF)):
                parts.append(more)
                have += len(more)
            joined = b"".join(parts)
            out, self._buf, self._at = joined[:n], joined, min(n, len(joined))
        self.pos += len(out)
        return out

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        """Forward only, by reading (so the diff ID still sees every byte)."""
        if whence != 0 or pos < self.pos:
            raise tarfile.ReadError("the layer's archive seeks backwards")
        while self.pos < pos and self.read(min(BUF, pos - self.pos)):
            pass
        return self.pos

    def seekable(self) -> bool:
        return False


def _contents(tf: tarfile.TarFile, m: tarfile.TarInfo) -> Iterator[bytes]:
    """A regular file's bytes in pieces of at most BUF, straight from the stream (a
    sparse one through tarfile, which knows its map)."""
    if m.sparse is not None:
        src = tf.extractfile(m)
        while src is not None and (data := src.read(BUF)):
            yield data
        return
    stream = tf.fileobj
    left = m.size
    while left > 0:
        data = stream.read(min(BUF, left))
        if not data:
            raise tarfile.ReadError("unexpected end of data")
        left -= len(data)
        yield data


class _Extractor:
    """Writes entries into the layer's private temp dir, in archive order.

    Per entry it spends as few system calls as it can, since on a layer of tens of
    thousands of small files they are the cost (issue 40): a name is created first
    and cleared only if it exists (EEXIST), directories already walked are
    remembered (`_known`, forgotten whenever a directory is removed: nothing else
    in this dir can change one into something else), and a regular file's owner,
    xattrs, mode and times go through its open descriptor, not its path."""

    def __init__(self, root: Path, bound: Bound, what: str) -> None:
        self.root = root
        self._root = str(root)
        self.dirs: list[tuple[str, float]] = []
        self._bound = bound
        self._what = what
        self._declared = Bound(bound.limit, bound.why, bound.exhausted)  # sparse files
        self._known: set[str] = set()  # relative paths walked as real directories

    def _parent(self, parts: list[str], name: str) -> str:
        """The entry's parent dir, created as needed; refuses any non-directory on the way."""
        if len(parts) == 1:
            return self._root
        rel = "/".join(parts[:-1])
        if rel in self._known:
            return f"{self._root}/{rel}"
        cur = self._root
        for comp in parts[:-1]:
            cur = f"{cur}/{comp}"
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                os.mkdir(cur, 0o755)
                continue
            if not stat.S_ISDIR(st.st_mode):
                kind = "symlink" if stat.S_ISLNK(st.st_mode) else "non-directory"
                raise HostileLayer(f"layer entry {name!r}: path goes through a {kind} {comp!r}")
        if len(self._known) >= MAX_KNOWN_DIRS:
            self._known.clear()
        self._known.add(rel)
        return cur

    def _clear(self, path: str, keep_dir: bool) -> bool:
        """Remove what is at `path` unless it is a dir we keep; True if a dir was kept."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return True
            shutil.rmtree(path)
            self._known.clear()  # the removed dir, or one under it, may be in there
        else:
            os.unlink(path)
        return False

    def _make(self, path: str, create: Callable[[], None]) -> None:
        """`create` the entry at `path`, replacing a non-directory or directory there."""
        try:
            create()
        except FileExistsError:
            self._clear(path, keep_dir=False)
            create()

    def entry(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        parts = _parts(m.name, "")
        if not parts:
            return  # the layer root itself
        base = parts[-1]
        parent = self._parent(parts, m.name)
        if base == OPAQUE:
            os.setxattr(parent, OPAQUE_XATTR, b"y")
            return
        if base.startswith(WHITEOUT):
            hidden = base[len(WHITEOUT) :]
            if hidden in ("", ".", "..") or hidden.startswith(WHITEOUT):
                raise HostileLayer(f"layer entry {m.name!r}: malformed whiteout")
            target = f"{parent}/{hidden}"
            self._make(target, lambda: os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0)))
            return
        target = f"{parent}/{base}"
        if m.isreg():
            self._file(tf, m, target)
            return
        if m.isdir():
            try:
                os.mkdir(target, 0o700)
            except FileExistsError:
                if not self._clear(target, keep_dir=True):
                    os.mkdir(target, 0o700)
        elif m.islnk():
            self._hardlink(m, target)
            return
        elif m.issym():
            self._make(target, lambda: os.symlink(m.linkname, target))
        elif m.ischr() or m.isblk():
            kind = stat.S_IFCHR if m.ischr() else stat.S_IFBLK
            dev = os.makedev(m.devmajor, m.devminor)
            self._make(target, lambda: os.mknod(target, kind | 0o600, dev))
        elif m.isfifo():
            self._make(target, lambda: os.mkfifo(target, 0o600))
        else:
            raise HostileLayer(f"layer entry {m.name!r}: unsupported tar type {m.type!r}")
        self._metadata(m, target, parts)

    def _file(self, tf: tarfile.TarFile, m: tarfile.TarInfo, target: str) -> None:
        """A regular file: created, written and given its metadata through one fd."""
        self._declared.spend(m.size, f"{self._what} (file {m.name!r})")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = -1

        def create() -> None:
            nonlocal fd
            fd = os.open(target, flags, 0o600)

        self._make(target, create)
        try:
            for data in _contents(tf, m):
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            os.fchown(fd, m.uid, m.gid)
            self._xattrs(m, fd)
            os.fchmod(fd, m.mode & 0o7777)  # after chown, which clears setuid bits
            os.utime(fd, (m.mtime, m.mtime))
        finally:
            os.close(fd)

    def _hardlink(self, m: tarfile.TarInfo, target: str) -> None:
        parts = _parts(m.linkname, "hard link target of " + repr(m.name))
        if not parts:
            raise HostileLayer(f"layer entry {m.name!r}: hard link to the layer root")
        src = f"{self._parent(parts, m.linkname)}/{parts[-1]}"
        try:
            st = os.lstat(src)
        except FileNotFoundError:
            raise HostileLayer(
                f"layer entry {m.name!r}: hard link target {m.linkname!r} is not in this layer"
            ) from None
        if stat.S_ISDIR(st.st_mode):
            raise HostileLayer(f"layer entry {m.name!r}: hard link to a directory")
        try:
            os.link(src, target, follow_symlinks=False)
        except FileExistsError:
            self._clear(target, keep_dir=False)  # its target may have gone with it
            try:
                os.link(src, target, follow_symlinks=False)
            except FileNotFoundError:
                raise HostileLayer(f"layer entry {m.name!r}: hard link target "
                                   f"{m.linkname!r} is not in this layer") from None

    def _xattrs(self, m: tarfile.TarInfo, at: str | int) -> None:
        for key, value in m.pax_headers.items():
            if not key.startswith(XATTR_PAX):
                continue
            name = key[len(XATTR_PAX) :]
            if name.startswith("trusted.overlay."):
                raise HostileLayer(f"layer entry {m.name!r}: overlay xattr {name!r} refused")
            try:
                if isinstance(at, int):
                    os.setxattr(at, name, value.encode("utf-8", "surrogateescape"))
                else:
                    os.setxattr(at, name, value.encode("utf-8", "surrogateescape"),
                                follow_symlinks=False)
            except OSError as e:
                log.warning("layer entry %s: xattr %s not kept: %s", _shown(m.name),
                            _shown(name), e.strerror or e)

    def _metadata(self, m: tarfile.TarInfo, target: str, parts: list[str]) -> None:
        os.chown(target, m.uid, m.gid, follow_symlinks=False)
        self._xattrs(m, target)
        if m.issym():
            os.utime(target, (m.mtime, m.mtime), follow_symlinks=False)
            return
        os.chmod(target, m.mode & 0o7777)  # after chown, which clears setuid bits
        if m.isdir():
            self.dirs.append(("/".join(parts), m.mtime))
        else:
            os.utime(target, (m.mtime, m.mtime))

    def finish(self) -> None:
        """Directory mtimes last: writing their children changed them."""
        for rel, mtime in reversed(self.dirs):
            self._utime_within(tuple(rel.split("/")), mtime)

    def _utime_within(self, parts: tuple[str, ...], mtime: float) -> None:
        """Set a directory's times through its parents opened one by one without following
        a link: a later entry may have replaced it or a parent, by a symlink out of the
        layer too. Such a directory is gone, and keeps no time."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for comp in parts[:-1]:
                inner = os.open(comp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                dir_fd=fd)
                os.close(fd)
                fd = inner
            os.utime(parts[-1], (mtime, mtime), dir_fd=fd, follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise
        finally:
            os.close(fd)


def disk_usage(path: Path) -> tuple[int, int]:
    """(bytes allocated, inodes) under `path`, counting each hard-linked inode once; entries
    that vanish during the walk (the tree may belong to a running container) are skipped."""
    seen: set[int] = set()
    used = inodes = 0
    stack = [str(path)]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except (FileNotFoundError, NotADirectoryError):
            continue  # a running container removed it while we walked
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if st.st_nlink > 1:
                    if st.st_ino in seen:
                        continue
                    seen.add(st.st_ino)
                used += st.st_blocks * 512
                inodes += 1
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
    return used, inodes


# pax and GNU long-name headers are read into memory whole by tarfile; a legitimate one
# holds a path or a few xattrs, so anything larger is an attack on the daemon's memory.
MAX_EXTENDED_HEADER = 1 << 20


class _BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo that refuses oversized pax/GNU extended headers before reading them."""

    def _proc_pax(self, tf: tarfile.TarFile) -> tarfile.TarInfo:
        self._check_extended_size()
        return super()._proc_pax(tf)  # type: ignore[misc]

    def _proc_gnulong(self, tf: tarfile.TarFile) -> tarfile.TarInfo:
        self._check_extended_size()
        return super()._proc_gnulong(tf)  # type: ignore[misc]

    def _check_extended_size(self) -> None:
        if self.size > MAX_EXTENDED_HEADER:
            raise HostileLayer(
                f"extended tar header of {self.size} bytes (limit {MAX_EXTENDED_HEADER})"
            )


def unpack_layer(blob: Path | Source, dest: Path, tmp_root: Path, diff_id: str | None,
                 bound: Bound | None = None, name: str = "") -> tuple[int, int]:
    """Unpack `blob` (a file, or a stream named `name`) into `dest` (atomically) and
    check its diff ID; returns its disk usage. A stream must end (b"") only once its
    bytes are known good: `dest` appears then.

    Nothing is left behind on any failure: a corrupt or hostile layer, a layer over
    `bound`, the disk filling up (ResourceExhausted), or the stream's read failing."""
    import zstandard  # on the first unpack: an idle node does not carry them
    from zlib_ng import zlib_ng

    inflate_error = cast(type[Exception], zlib_ng.error)  # its stub types the class as one

    bound = bound or Bound(2**63, "unbounded")
    what = f"layer {blob.name if isinstance(blob, Path) else name}"
    tmp = tmp_root / f"unpack-{uuid.uuid4().hex}"
    try:
        tmp.mkdir(mode=0o755)
        with open(blob, "rb") if isinstance(blob, Path) else contextlib.nullcontext(blob) \
                as raw:
            reader = _HashingReader(_decompressing(raw), bound, what)
            ex = _Extractor(tmp, bound, what)
            try:
                tf = tarfile.TarFile(fileobj=_TarStream(reader), mode="r",  # type: ignore[arg-type]
                                     tarinfo=_BoundedTarInfo)
                with tf:
                    while (member := tf.next()) is not None:
                        # tarfile keeps every member it has read: a layer may hold millions
                        tf.members.clear()  # type: ignore[attr-defined]
                        check_header(member, what)
                        try:
                            ex.entry(tf, member)
                        except (ValueError, OverflowError, OSError) as e:  # past the checks
                            if isinstance(e, OSError) and e.errno not in _REFUSALS:
                                raise  # the host's (a full disk): not the layer's doing
                            why = e.strerror if isinstance(e, OSError) else type(e).__name__
                            raise HostileLayer(f"{what}: layer entry {_shown(member.name)}: "
                                               f"not unpackable ({why})") from None
            except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error, inflate_error,
                    zstandard.ZstdError) as e:
                raise errors.InvalidArgument(f"{what}: corrupt archive: {e}") from None
            reader.drain()
            ex.finish()
        got = "sha256:" + reader.hash.hexdigest()
        if diff_id is not None and got != diff_id:
            raise errors.InvalidArgument(
                f"{what}: uncompressed content hashes to {got}, config says {diff_id}"
            )
        usage = disk_usage(tmp)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
            shutil.rmtree(tmp)  # unpacked concurrently by someone else: theirs is as good
        return usage
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise errors.ResourceExhausted(
                f"{what}: no space left on the image filesystem ({tmp_root}) while unpacking"
            ) from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
