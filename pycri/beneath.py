"""Files pycri makes in directories others made (the kubelet's pod log directories):
reached one component at a time from the base directory, each opened with O_NOFOLLOW,
so a link planted anywhere beneath the base is refused, never followed (issue 41).

The base itself is the caller's to trust (the kubelet names it). Failures are OSError:
ELOOP or ENOTDIR where a link stands, EINVAL for what is not a regular file, naming the
offending component. Blocking filesystem work: call from a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence

from pycri.boundedjson import file_kind

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def parts_of(rel: str) -> tuple[str, ...]:
    """`rel`'s components: relative and normalised, no '.' or '..' (EINVAL otherwise)."""
    parts = tuple(rel.split("/"))
    if any(p in ("", ".", "..") for p in parts):
        raise OSError(errno.EINVAL, f"{rel!r} is not a plain relative path")
    return parts


def walk(base: str | os.PathLike[str], parts: Sequence[str], make: int | None = None) -> int:
    """A directory fd of base/parts..., each component opened without following a link
    (made with mode `make` first where absent, if given). The caller closes it."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, comp in enumerate(parts):
            if make is not None:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(comp, make, dir_fd=fd)
            try:
                inner = os.open(comp, _DIR, dir_fd=fd)
            except OSError as e:
                raise OSError(e.errno, _why(e, fd, comp), os.path.join(*parts[:i + 1])
                              ) from None
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def ensure_file(base: str | os.PathLike[str], rel: str, mode: int,
                make_dirs: int | None = None) -> bool:
    """`base/rel` as a regular file, created with its final `mode` where absent, with no
    link followed beneath `base`; whether it was created here."""
    parts = parts_of(rel)
    fd = walk(base, parts[:-1], make_dirs)
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        try:
            try:
                f, made = os.open(parts[-1], flags | os.O_CREAT | os.O_EXCL, mode,
                                  dir_fd=fd), True
            except FileExistsError:
                f, made = os.open(parts[-1], flags, dir_fd=fd), False
        except OSError as e:
            raise OSError(e.errno, _why(e, fd, parts[-1]), rel) from None
        try:
            st = os.fstat(f)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, f"is a {file_kind(st.st_mode)}, not a regular file",
                              rel)
        finally:
            os.close(f)
    finally:
        os.close(fd)
    return made


def remove(base: str | os.PathLike[str], rel: str) -> None:
    """Unlink `base/rel` reached with no link followed; gone already is fine."""
    parts = parts_of(rel)
    try:
        fd = walk(base, parts[:-1])
    except FileNotFoundError:
        return
    try:
        os.unlink(parts[-1], dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def refuse_link(base: str | os.PathLike[str], rel: str) -> None:
    """ELOOP if `base/rel` is a link or a link stands beneath `base` on the way to it;
    nothing there is fine."""
    parts = parts_of(rel)
    fd = walk(base, parts[:-1])
    try:
        st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    finally:
        os.close(fd)
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "is a symbolic link", rel)


def _why(e: OSError, fd: int, name: str) -> str:
    """A link met where O_NOFOLLOW stops is ELOOP or ENOTDIR: say so plainly."""
    if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.EISDIR):
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return e.strerror or str(e)
        if stat.S_ISLNK(st.st_mode):
            return "is a symbolic link"
        return f"is a {file_kind(st.st_mode)}"
    return e.strerror or str(e)
