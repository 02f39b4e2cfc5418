"""A directory tree as a comparable value, for tests that two unpacks agree."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def tree(root: Path) -> dict[str, tuple[object, ...]]:
    """Every path's kind, owner, mode, time, content (device number) or target, its
    xattrs (overlay's opaque marker among them), and hard-link group."""
    inodes: dict[int, list[str]] = {}
    seen: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            st_ = os.lstat(p)
            xattrs = {x: os.getxattr(p, x, follow_symlinks=False)
                      for x in os.listxattr(p, follow_symlinks=False)}
            common = (stat.S_IFMT(st_.st_mode), st_.st_uid, st_.st_gid, sorted(xattrs.items()))
            if stat.S_ISLNK(st_.st_mode):
                seen[rel] = (*common, os.readlink(p))
            elif stat.S_ISDIR(st_.st_mode):
                # No time: GNU tar sets a directory's once the archive has moved past
                # it, so an entry that comes back into it later leaves "now" (the
                # extractor sets them all at the end: test_metadata_kept).
                seen[rel] = (*common, stat.S_IMODE(st_.st_mode))
            else:
                inodes.setdefault(st_.st_ino, []).append(rel)
                body = Path(p).read_bytes() if stat.S_ISREG(st_.st_mode) else st_.st_rdev
                seen[rel] = (*common, stat.S_IMODE(st_.st_mode), st_.st_mtime_ns // 10**9, body)
    for group in inodes.values():
        for rel in group:
            seen[rel] = (*seen[rel], tuple(sorted(group)))
    return seen
