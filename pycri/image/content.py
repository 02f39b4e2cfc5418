"""Content-addressed blob store: `<root>/blobs/sha256/<hex>`.

A blob becomes visible only by an atomic rename after its digest and size
were checked, so a reader never sees a partial or unverified blob; ingest
files left by a crash are swept by `recover`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pycri import errors
from pycri.image.reference import is_digest


class DigestMismatch(errors.InvalidArgument):
    """Content did not hash to the digest (or length) it was announced with: the image
    (or its registry) is wrong, and the pull is refused like any other bad image."""


@contextmanager
def _disk(what: str) -> Iterator[None]:
    """A full disk is the node's problem, not the image's: say so (ResourceExhausted)."""
    try:
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise errors.ResourceExhausted(f"{what}: no space left on the image filesystem") \
                from None
        raise


class BlobWriter:
    """A temp file that hashes what is written and commits only if it verifies; with no
    `path`, only the hash and the count (a layer streamed to its unpack, not kept)."""

    def __init__(self, path: Path | None, final: Path, digest: str, size: int | None) -> None:
        self.path, self._final, self.digest, self.size = path, final, digest, size
        self._hash = hashlib.sha256()
        self._f = None
        if path is not None:
            with _disk(f"blob {digest}"):
                self._f = open(path, "xb")  # noqa: SIM115 - closed in commit/abort
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        if self.size is not None and self.written > self.size:
            raise DigestMismatch(f"blob {self.digest}: more than the expected {self.size} bytes")
        self._hash.update(data)
        if self._f is not None:
            with _disk(f"blob {self.digest}"):
                self._f.write(data)

    def commit(self) -> Path:
        """Check the size and digest; a blob with a file is then in the store."""
        if self._f is not None:
            with _disk(f"blob {self.digest}"):
                self._f.close()
        if self.size is not None and self.written != self.size:
            raise DigestMismatch(
                f"blob {self.digest}: got {self.written} bytes, expected {self.size}"
            )
        got = "sha256:" + self._hash.hexdigest()
        if got != self.digest:
            raise DigestMismatch(f"blob {self.digest}: content hashes to {got}")
        if self.path is not None:
            os.replace(self.path, self._final)
        return self._final

    def abort(self) -> None:
        if self._f is None or self.path is None:
            return
        with contextlib.suppress(OSError):  # a full disk fails the flush; the file goes anyway
            self._f.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class ContentStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.ingest = root / "ingest"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.ingest.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        if not is_digest(digest):
            raise errors.InvalidArgument(f"unsupported digest {digest!r} (sha256 only)")
        return self.blobs / digest.split(":", 1)[1]

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def size(self, digest: str) -> int:
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            return 0

    def read(self, digest: str) -> bytes:
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError:
            raise errors.NotFound(f"blob {digest} is not in the content store") from None

    def writer(self, digest: str, size: int | None, keep: bool = True) -> BlobWriter:
        """A writer of `digest`'s blob; with `keep` off it only verifies what it is given."""
        final = self.path(digest)
        return BlobWriter(self.ingest / uuid.uuid4().hex if keep else None, final, digest, size)

    def put(self, digest: str, data: bytes) -> None:
        """Store small verified content (manifests, configs) in one go."""
        if self.has(digest):
            return
        w = self.writer(digest, len(data))
        try:
            w.write(data)
            w.commit()
        except BaseException:
            w.abort()
            raise

    def digests(self) -> Iterator[str]:
        for p in self.blobs.iterdir():
            yield "sha256:" + p.name

    def delete(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(digest).unlink()

    def recover(self) -> None:
        """Drop half-written ingest files left by a crash."""
        shutil.rmtree(self.ingest, ignore_errors=True)
        self.ingest.mkdir(parents=True, exist_ok=True)
