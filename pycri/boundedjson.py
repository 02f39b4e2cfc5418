"""JSON from a source pycri does not trust (a stored row, an archive's metadata, a
file in a directory of its own), decoded with bounds checked before the parser runs:
its size, and how deep its arrays and objects nest (Python's parser recurses once per
level, so a deep enough document is a RecursionError, which no caller expects); and
such a file read whole, bounded, without following a link or blocking.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from typing import Any

_NULL = os.makedev(1, 3)  # /dev/null
# A string (escapes included) or a bracket: brackets inside strings do not count.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[][{}]')


class BoundsError(ValueError):
    """The text is larger or nests deeper than allowed; never parsed."""


def nesting(text: str, limit: int) -> int:
    """How deep `text`'s arrays and objects nest, counting stopped past `limit`."""
    depth = deepest = 0
    for m in _TOKENS.finditer(text):
        c = m.group()[0]
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif c in "]}":
            depth -= 1
    return deepest


def loads(text: str | bytes, max_bytes: int, max_depth: int) -> Any:
    """`json.loads`, or BoundsError (a ValueError, as json's own errors are) when the
    text is over `max_bytes` or nests deeper than `max_depth`."""
    if len(text) > max_bytes:
        raise BoundsError(f"is larger than {max_bytes} bytes")
    if isinstance(text, bytes):
        text = text.decode()
    if nesting(text, max_depth) > max_depth:
        raise BoundsError(f"nests deeper than {max_depth} levels")
    return json.loads(text)


def file_kind(mode: int) -> str:
    """A file type in words, for error messages."""
    for test, name in (
        (stat.S_ISDIR, "directory"), (stat.S_ISREG, "regular file"), (stat.S_ISLNK, "symlink"),
        (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def read_file(path: str | os.PathLike[str], max_bytes: int, follow: bool = False) -> bytes:
    """A regular file's bytes, at most `max_bytes`; OSError otherwise (a link unless
    `follow`, a FIFO, which the non-blocking open keeps from hanging the reader, a
    device or a directory, a larger file). `follow` is for paths the operator chose (a
    config file, a conf dir's entries, which packages often link): what the link names
    must still be a regular file within the bound."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == _NULL:
            return b""  # the null device: the usual way to say "no file" (--config /dev/null)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"is a {file_kind(st.st_mode)}, not a regular file")
        data = bytearray()
        while len(data) <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes")
    return bytes(data)
