"""Container root filesystems as overlay mounts over the shared layer directories.

Each snapshot is `<dir>/<key>/{upper,work,rootfs}`; a read-only view (an image
volume) is `<dir>/<key>/{empty,rootfs}`, an overlay of lower dirs only. The
lowerdir option lists layer directories top-most first; when absolute paths
would overflow the one-page mount data limit, the mount is done by `mount(8)`
run with the layer-link directory as its working directory and short relative
names, so the daemon never has to chdir.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import shutil
from pathlib import Path

from pycri import errors, procs

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
MNT_DETACH = 2
PAGE = os.sysconf("SC_PAGE_SIZE")
LINK_LEN = 12
# mount(8) for layer stacks too long for one page of options (relative lowerdirs).
MOUNT_TIMEOUT = 60.0


def _mount_overlay(target: Path, options: str) -> None:
    if _libc.mount(b"overlay", os.fsencode(target), b"overlay", 0, options.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount overlay on {target}: {os.strerror(err)}")


def _umount(target: Path) -> None:
    if _libc.umount2(os.fsencode(target), 0) == 0:
        return
    err = ctypes.get_errno()
    if err == 16:  # EBUSY: detach so that removal can go on; the kernel frees it later
        if _libc.umount2(os.fsencode(target), MNT_DETACH) == 0:
            return
        err = ctypes.get_errno()
    if err != 22:  # EINVAL: not a mount point (already unmounted)
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


def is_mounted(path: Path) -> bool:
    """True if `path` is a mount point, per /proc/self/mountinfo."""
    want = os.fsencode(os.path.realpath(path))
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            mp = line.split(b" ")[4].replace(b"\\040", b" ")
            if mp == want:
                return True
    return False


def resolve_within(root: Path, sub_path: str) -> Path:
    """`sub_path` inside `root`, following symlinks as if `root` were `/`.

    An image volume's sub path is looked up the way the container would see the
    image, so an absolute symlink in the image points into the image, never to
    the host. `..` is refused outright rather than clamped: it is a user error.
    """
    parts = [p for p in sub_path.split("/") if p not in ("", ".")]
    if sub_path.startswith("/") or ".." in parts:
        raise errors.InvalidArgument(
            f"image sub path {sub_path!r} must be relative and must not contain '..'"
        )
    resolved: list[str] = []
    links = 0
    while parts:
        name = parts.pop(0)
        if name == "..":  # only from a symlink's target: clamp at the image root
            if resolved:
                resolved.pop()
            continue
        here = root.joinpath(*resolved, name)
        if not here.is_symlink():
            if not here.exists():
                raise errors.InvalidArgument(
                    f"image sub path {sub_path!r} does not exist in the image"
                )
            resolved.append(name)
            continue
        links += 1
        if links > 40:
            raise errors.InvalidArgument(f"image sub path {sub_path!r}: too many symlinks")
        target = os.readlink(here)
        if target.startswith("/"):
            resolved = []
        parts = [p for p in target.split("/") if p not in ("", ".")] + parts
    return root.joinpath(*resolved)


class Snapshotter:
    def __init__(self, root: Path, layers: Path, links: Path, empty: Path) -> None:
        self.root, self.layers, self.links, self.empty = root, layers, links, empty
        for d in (root, layers, links, empty):
            d.mkdir(parents=True, exist_ok=True)

    def link_layer(self, chain_hex: str) -> None:
        """A short name for a layer dir, for mount option strings that would not fit a page."""
        link = self.links / chain_hex[:LINK_LEN]
        target = f"../{self.layers.name}/{chain_hex}"
        try:
            os.symlink(target, link)
        except FileExistsError:
            if os.readlink(link) != target:
                raise errors.FailedPrecondition(f"layer link {link} collides") from None

    def unlink_layer(self, chain_hex: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.links / chain_hex[:LINK_LEN])

    def dir(self, key: str) -> Path:
        if not key or "/" in key or key in (".", ".."):
            raise errors.InvalidArgument(f"invalid snapshot key {key!r}")
        return self.root / key

    async def prepare(self, key: str, chain_hexes: list[str], readonly: bool = False) -> Path:
        """Mount the overlay for `key`; chain IDs bottom-most first. Undoes itself on failure.

        A read-only view has no upper or work dir, so nothing can write through it; the
        kernel wants two lower dirs at least, hence the empty dirs at the bottom.
        """
        d = self.dir(key)
        rootfs = d / "rootfs"
        if is_mounted(rootfs):
            return rootfs
        upper, work, bottom = d / "upper", d / "work", d / "empty"
        for p in (d, *((bottom,) if readonly else (upper, work)), rootfs):
            p.mkdir(mode=0o755, exist_ok=True)
        try:
            top_first = list(reversed(chain_hexes))
            if readonly:
                tail = [str(self.empty)] + ([str(bottom)] if not chain_hexes else [])
                writable = ""
            else:
                tail = [] if chain_hexes else [str(self.empty)]
                writable = f",upperdir={upper},workdir={work}"
            lower = ":".join([*(str(self.layers / h) for h in top_first), *tail])
            opts = f"lowerdir={lower}{writable}"
            if len(opts) < PAGE - 1:
                await asyncio.to_thread(_mount_overlay, rootfs, opts)
            else:
                short = ":".join([*(h[:LINK_LEN] for h in top_first), *tail])
                await self._mount_relative(rootfs, f"lowerdir={short}{writable}")
        except BaseException:
            if is_mounted(rootfs):
                _umount(rootfs)
            shutil.rmtree(d, ignore_errors=True)
            raise
        return rootfs

    async def _mount_relative(self, rootfs: Path, opts: str) -> None:
        if len(opts) >= PAGE - 1:
            raise errors.InvalidArgument("image has too many layers for one overlay mount")
        rc, _, err = await procs.run(
            ["mount", "-t", "overlay", "overlay", "-o", opts, str(rootfs)],
            stdin=None, timeout=MOUNT_TIMEOUT, cwd=self.links,
        )
        if rc != 0:
            raise OSError(f"mount overlay on {rootfs}: {err.decode(errors='replace').strip()}")

    async def remove(self, key: str) -> None:
        """Unmount and delete; absent is fine."""
        d = self.dir(key)
        rootfs = d / "rootfs"
        if rootfs.exists() and is_mounted(rootfs):
            await asyncio.to_thread(_umount, rootfs)
        await asyncio.to_thread(shutil.rmtree, d, True)

    def upper(self, key: str) -> Path:
        return self.dir(key) / "upper"

    def list_keys(self) -> list[str]:
        return [p.name for p in self.root.iterdir() if p.is_dir()]
