"""The registry's doors and the layer-header door, fuzzed (issue 39, item 6): token
answers, error bodies and manifest documents mutated from real ones, and tar entries
mutated from the busybox test layer's, each through its door. The oracle: a typed
value or a domain error of the door's class (never another exception), within a
bounded time; an unpack leaves nothing outside its layer and nothing at all when it
fails.

Bounded for CI (PYCRI_FUZZ_EXAMPLES examples per door, 150 by default); a long run:
PYCRI_FUZZ_EXAMPLES=100000 .venv/bin/pytest tests/image/test_fuzz_doors.py"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pycri import errors
from pycri.image import answers, schema
from pycri.image.unpack import Bound, unpack_layer
from tests.lib import doors, images
from tests.lib.images import Entry

EXAMPLES = int(os.environ.get("PYCRI_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=2000, derandomize=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])

_TEXT = st.one_of(st.text(max_size=40), st.sampled_from(
    ["", "tok.abc", "a\r\nX: 1", "\x00", "\ud800", "DENIED", "sha256:" + "a" * 64]))
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                     st.floats(allow_nan=True), _TEXT)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)), max_leaves=30)




def _bodies(seed: Any) -> st.SearchStrategy[bytes]:
    """A mutated document, one nested past every bound, or its text cut and spliced."""
    text = json.dumps(seed).encode()
    return st.one_of(
        doors.mutated(seed, _TEXT, _VALUES).map(lambda d: json.dumps(d).encode()),
        st.integers(1, 3000).map(lambda n: b'{"token": ' + b"[" * n + b"]" * n + b"}"),
        st.builds(lambda i, junk: text[:i] + junk + text[i:], st.integers(0, len(text)),
                  st.binary(max_size=40)),
    )


TOKEN = {"token": "tok.cmVwb3NpdG9yeTpidXN5Ym94OnB1bGw=", "access_token": "tok.x",
         "expires_in": 300, "issued_at": "2026-12-07T10:00:00Z"}
ERROR = {"errors": [{"code": "DENIED", "message": "requested access to the resource is denied",
                     "detail": [{"Type": "repository", "Name": "busybox"}]}]}


@FUZZ
@given(_bodies(TOKEN))
def test_token_answers(body: bytes) -> None:
    try:
        token = answers.token(body, "127.0.0.1:5000/busybox")
    except answers.RegistryUnavailable as e:
        assert str(e).startswith("127.0.0.1:5000/busybox: the token service's answer ")
        return
    assert 0 < len(token) <= answers.MAX_TOKEN and token.isascii() and token.isprintable()


@FUZZ
@given(_bodies(ERROR))
def test_error_bodies(body: bytes) -> None:
    assert set(answers.error_codes(body)) <= answers.ERROR_CODES


MANIFEST = {
    "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
               "digest": "sha256:" + "c" * 64, "size": 600},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": "sha256:" + "d" * 64, "size": 1000}],
    "annotations": {"org.opencontainers.image.created": "2026-12-07T10:00:00Z"},
}
CONFIG = {"architecture": "amd64", "os": "linux", "created": "2026-12-07T10:00:00Z",
          "config": {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"], "User": "1000:1000",
                     "WorkingDir": "/", "Labels": {"a": "b"}, "StopSignal": "SIGTERM"},
          "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "e" * 64]}}
INDEX = {"schemaVersion": 2, "manifests": [
    {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + "f" * 64,
     "size": 500, "platform": {"os": "linux", "architecture": "amd64"}}]}


@FUZZ
@given(st.one_of(_bodies(MANIFEST).map(lambda b: ("manifest", b)),
                 _bodies(CONFIG).map(lambda b: ("config", b)),
                 _bodies(INDEX).map(lambda b: ("index", b))))
def test_documents(case: tuple[str, bytes]) -> None:
    kind, body = case
    try:
        doc = schema.parse_json(body, kind)
        if kind == "manifest":
            schema.manifest(doc, kind)
        elif kind == "config":
            schema.image_config(doc, kind, 1)
        else:
            schema.index_entries(doc, kind)
    except errors.InvalidArgument as e:
        assert str(e).startswith(kind), str(e)


# -- layer headers ---------------------------------------------------------------------

REAL = [e for layer in images.busybox_layers() for e in layer]
_NUMBERS = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([0, 1000, 2**32 - 1]))
_TIMES = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, 1.7e9, 2.0**34, -(2.0**34), 1e20]))
_NAMES = st.one_of(st.text(max_size=20), st.sampled_from(
    ["a" * 300, "/".join(["p" * 250] * 20), "../x", "/abs", "a\x00b", ".wh..", "etc/.wh.x"]))


@st.composite
def _entries(draw: st.DrawFn) -> tuple[list[Entry], dict[str, str], Entry]:
    """The real layer's directories, then one of its entries with one to three header
    fields replaced, as raw pax records where the writer would refuse the value."""
    base = draw(st.sampled_from(REAL))
    entry = Entry(base.name, base.kind, base.data, base.mode, base.uid, base.gid,
                  base.linkname, dict(base.xattrs))
    pax: dict[str, str] = {}
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(["path", "linkpath", "uid", "gid", "mtime", "kind",
                                      "xattr", "mode", "dev"]))
        if field in ("path", "linkpath"):
            pax[field] = draw(_NAMES)
        elif field in ("uid", "gid"):
            pax[field] = str(draw(_NUMBERS))
        elif field == "mtime":
            pax["mtime"] = repr(draw(_TIMES))
        elif field == "kind":
            entry.kind = draw(st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE,
                                               tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE,
                                               tarfile.FIFOTYPE, b"Z"]))
        elif field == "xattr":
            pax["SCHILY.xattr." + draw(_NAMES)] = draw(st.text(max_size=20))
        elif field == "mode":
            entry.mode = draw(st.integers(0, 0o7777777))
        else:
            entry.devmajor, entry.devminor = (draw(st.integers(0, 0o7777777)) for _ in "ab")
    dirs = [e for e in REAL if e.kind == tarfile.DIRTYPE]
    return dirs, pax, entry


def _tar(dirs: list[Entry], pax: dict[str, str], entry: Entry) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in [*dirs, entry]:
            ti = tarfile.TarInfo(e.name)
            ti.type, ti.mode, ti.uid, ti.gid = e.kind, e.mode, e.uid, e.gid
            ti.mtime, ti.linkname = images.MTIME, e.linkname
            ti.size = len(e.data) if e.kind == tarfile.REGTYPE else 0
            ti.devmajor, ti.devminor = e.devmajor, e.devminor
            ti.pax_headers = pax if e is entry else {}
            tf.addfile(ti, io.BytesIO(e.data) if e.kind == tarfile.REGTYPE else None)
    return buf.getvalue()


@pytest.fixture
def unpack_dirs(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "tmp").mkdir()
    canary = tmp_path / "canary"
    canary.mkdir()
    return tmp_path, canary


@FUZZ
@given(_entries())
def test_layer_headers(unpack_dirs: tuple[Path, Path],
                       case: tuple[list[Entry], dict[str, str], Entry]) -> None:
    root, canary = unpack_dirs
    try:
        raw = _tar(*case)
    except (ValueError, UnicodeError, tarfile.TarError):
        return  # not writable as a tar at all: nothing to unpack
    blob, dest = root / "blob", root / "layer"
    blob.write_bytes(raw)
    try:
        unpack_layer(blob, dest, root / "tmp", None, Bound(64 << 20, "test bound"))
    except (errors.InvalidArgument, errors.ResourceExhausted):
        assert not dest.exists()
    else:
        shutil.rmtree(dest)
    assert not list((root / "tmp").iterdir())  # no unpack left half-done
    assert not list(canary.iterdir())  # nothing written outside the layer
