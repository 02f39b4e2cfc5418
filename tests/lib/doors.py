"""Hostile input for the doors that are not CRI calls: CDI spec files, config files
(pycri.toml, registries.conf) and the /metrics listener (issue 22, item 11).

A corpus per door, one entry per attack, and hypothesis strategies that generate more
of the same, shared by tests/test_doors.py (bounded) and hack/fuzz-doors.py (long
runs). Files carry SECRET where an attacker would put what the file must not
disclose (a link to /etc/shadow, a credential); the oracle for a file is a clear error
of the door's own class that names the file, and never SECRET. For the listener: an
HTTP status line (or a hang-up) for every request, and the listener still serving.

To add an attack: one entry in the door's dict.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import tomli_w
from hypothesis import strategies as st

SECRET = "s3cr3t-9f8e7d"
SHADOW = (f"root:$y$j9T${SECRET}:20228:0:99999:7:::\n"
          f"{SECRET}:*:20228:0:99999:7:::\n").encode()


def spec(**changes: Any) -> dict[str, Any]:
    """A valid CDI spec of kind vendor.com/dev defining device `a`, with `changes`."""
    doc: dict[str, Any] = {"cdiVersion": "0.6.0", "kind": "vendor.com/dev",
                           "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}
    doc.update(changes)
    return doc


def _edits(**edits: Any) -> bytes:
    return json.dumps(spec(devices=[{"name": "a", "containerEdits": edits}])).encode()


def _laughs() -> bytes:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    return ("\n".join(lines) + "\n").encode()


# file name -> content; the suffix picks the parser.
CDI_SPECS: dict[str, bytes] = {
    "shadow.yaml": SHADOW,
    "shadow.json": SHADOW,
    "secret-key.yaml": f"{SECRET}: 1\n".encode(),
    "secret-version.yaml": f"cdiVersion: {SECRET}\nkind: vendor.com/dev\n".encode(),
    "secret-kind.yaml": f"cdiVersion: 0.6.0\nkind: {SECRET}\n".encode(),
    "secret-kind-class.json": json.dumps(spec(kind=f"vendor.com/{SECRET}!")).encode(),
    "secret-top-field.json": json.dumps(spec(**{SECRET: 1})).encode(),
    "secret-env.json": _edits(env=[SECRET]),
    "secret-device-name.json": json.dumps(spec(devices=[{"name": f"{SECRET}!"}])).encode(),
    "secret-device-twice.json": json.dumps(spec(devices=[{"name": SECRET},
                                                         {"name": SECRET}])).encode(),
    "secret-edits-field.json": _edits(**{SECRET: []}),
    "secret-node-type.json": _edits(deviceNodes=[{"path": "/dev/x", "type": SECRET}]),
    "secret-node-permissions.json": _edits(deviceNodes=[{"path": "/dev/x",
                                                         "permissions": SECRET}]),
    "secret-relative-path.json": _edits(deviceNodes=[{"path": SECRET}]),
    "secret-hook-name.json": _edits(hooks=[{"hookName": SECRET, "path": "/bin/true"}]),
    "secret-mount-path.json": _edits(mounts=[{"hostPath": "/x", "containerPath": SECRET}]),
    "yaml-error-on-secret-line.yaml": f"cdiVersion: 0.6.0\n{SECRET}: [\n".encode(),
    "yaml-undefined-alias.yaml": f"a: *{SECRET}\n".encode(),
    "yaml-unknown-tag.yaml": f"a: !{SECRET} 1\n".encode(),
    "yaml-python-tag.yaml": f"a: !!python/object:{SECRET} {{}}\n".encode(),
    "yaml-tab.yaml": f"a:\n\t{SECRET}\n".encode(),
    "yaml-control-char.yaml": f"a: {SECRET}\x07\n".encode(),
    "yaml-directive.yaml": f"%{SECRET} x\n---\na: 1\n".encode(),
    "yaml-laughs.yaml": _laughs(),
    "yaml-deep.yaml": b"[" * 100_000,
    "json-deep.json": b"[" * 100_000,
    "json-error.json": f'{{"{SECRET}": }}'.encode(),
    "json-trailing.json": json.dumps(spec()).encode() + SECRET.encode(),
    "not-utf8.yaml": b"\xff\xfe" + SECRET.encode(),
    "not-utf8.json": b"{\"" + SECRET.encode() + b"\xff\"}",
    "empty.yaml": b"",
    "null.json": b"null",
    "list.yaml": f"- {SECRET}\n".encode(),
    "too-big.json": b" " * (2 << 20),
}

# Specs naming a kind of their own: only a device of that kind would name them.
OTHER_KIND = {"secret-kind.yaml", "secret-kind-class.json"}

# pycri.toml contents; each must be refused by load + validate.
CONFIGS: dict[str, bytes] = {
    "shadow": SHADOW,
    "choice": f'log_level = "{SECRET}"\n'.encode(),
    "handler": f'default_runtime = "{SECRET}"\n'.encode(),
    "metrics-address": f'metrics_address = "{SECRET}"\n'.encode(),
    "runtime-type": f'[runtimes.runc]\npath = "/usr/sbin/runc"\ntype = "{SECRET}"\n'.encode(),
    "number-as-string": f'[cni]\nplugin_timeout = "{SECRET}"\n'.encode(),
    "relative-path": f'root = "{SECRET}"\n'.encode(),
    "nul-in-path": f'[nri]\nsocket_path = "/{SECRET}\\u0000"\n'.encode(),
    "path-as-array": f'state = ["{SECRET}"]\n'.encode(),
    "dirs-as-string": f'[cdi]\nspec_dirs = "{SECRET}"\n'.encode(),
    "table-as-string": f'cni = "{SECRET}"\n'.encode(),
    "unterminated": f'pause_image = "{SECRET}\n'.encode(),
    "control-char": f'pause_image = "{SECRET}\x07"\n'.encode(),
    "not-utf8": b'pause_image = "\xff' + SECRET.encode() + b'"\n',
    "nan": b"[nri]\nrequest_timeout = nan\n",
    "huge": b"[cdi]\nmax_spec_bytes = 9223372036854775807\n",
}

# registries.conf contents; each must be refused by RegistriesConf.load.
REGISTRIES: dict[str, bytes] = {
    "shadow": SHADOW,
    "registry-not-tables": f'registry = "{SECRET}"\n'.encode(),
    "registry-of-numbers": b"registry = [1, 2]\n",
    "mirror-not-tables": f'[[registry]]\nlocation = "a.io"\nmirror = "{SECRET}"\n'.encode(),
    "location-not-string": b"[[registry]]\nlocation = 5\n",
    "unterminated": f'[[registry]]\nlocation = "{SECRET}\n'.encode(),
    "control-char": f'[[registry]]\nlocation = "{SECRET}\x07"\n'.encode(),
    "not-utf8": b'[[registry]]\nlocation = "\xff' + SECRET.encode() + b'"\n',
}

# Requests to the /metrics listener and the statuses each may get (None: a hang-up).
REQUESTS: dict[str, tuple[bytes, tuple[int | None, ...]]] = {
    "scrape": (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", (200,)),
    "head": (b"HEAD /metrics HTTP/1.0\r\n\r\n", (200,)),
    "huge-head": (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000, (400,)),
    "many-headers": (b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 3000 + b"\r\n", (400,)),
    "garbage": (b"\x00\xff\x16\x03\x01\x02\x00\r\n\r\n", (400,)),
    "tls-hello": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64, (None, 400)),
    "http09": (b"GET /\r\n\r\n", (400,)),
    "no-colon-header": (b"GET /metrics HTTP/1.1\r\nnocolon\r\n\r\n", (400,)),
    "nul-in-path": (b"GET /met\x00rics HTTP/1.1\r\n\r\n", (404,)),
    "traversal": (b"GET /../../etc/shadow HTTP/1.1\r\n\r\n", (404,)),
    "post-body": (b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", (405,)),
    "connect": (b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n", (405,)),
    "pipelined": (b"GET /metrics HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n", (200,)),
    "chunked-smuggle": (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                        b"Content-Length: 4\r\n\r\n0\r\n\r\n", (200,)),
    "odd-accept": (b"GET /metrics HTTP/1.1\r\nAccept: ;;;,,q=x\r\n"
                   b"Accept-Encoding: gzip;q=abc, \xff\r\n\r\n", (200,)),
    "silence": (b"", (None, 400)),
    "half-head": (b"GET /metrics HTTP/1.1\r\nHost:", (None, 400)),
}


def exchange(address: tuple[str, int], data: bytes, timeout: float) -> int | None:
    """Send `data` and our end of the stream, read to the end; the answer's status,
    or None on a hang-up."""
    answer = b""
    with socket.create_connection(address, timeout=timeout) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                answer += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
    if not answer:
        return None
    status = answer.split(b"\r\n", 1)[0].split(b" ")
    assert len(status) >= 3 and status[0].startswith(b"HTTP/1."), answer[:200]
    return int(status[1])


# -- generators ---------------------------------------------------------------------------

_TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["", SECRET, f"{SECRET}!", "/x",
                                                          "A=1", "0.6.0", "c", "rwm"]))
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64),
                     st.floats(allow_nan=True), _TEXT)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)), max_leaves=30)
_SPEC_KEYS = ("cdiVersion", "kind", "devices", "containerEdits", "annotations", "name",
              "env", "deviceNodes", "mounts", "hooks", "path", "hostPath", "type",
              "permissions", "hookName", "containerPath", "additionalGids", SECRET)


@st.composite
def mutated(draw: st.DrawFn, seed: Any, keys: st.SearchStrategy[str],
            values: st.SearchStrategy[Any] = _VALUES) -> Any:
    """`seed` (a JSON document) with one to three places replaced by a generated value,
    or given a new top-level key from `keys`: structure-aware mutation of a real input."""
    doc = json.loads(json.dumps(seed))
    for _ in range(draw(st.integers(1, 3))):
        node, path = doc, []
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node) if isinstance(node, dict)
                                       else list(range(len(node)))))
            path.append(key)
            node = node[key]
        value = draw(values)
        if not path:
            if isinstance(doc, dict):
                doc[draw(keys)] = value
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
    return doc


def spec_documents() -> st.SearchStrategy[Any]:
    """A valid spec with one to three places replaced by a generated value."""
    return mutated(spec(devices=[{"name": "a", "containerEdits": {
        "env": ["A=1"], "deviceNodes": [{"path": "/dev/x", "type": "c"}],
        "mounts": [{"hostPath": "/x", "containerPath": "/y"}],
        "hooks": [{"hookName": "prestart", "path": "/bin/true"}]}}]),
        st.sampled_from(_SPEC_KEYS))


def toml_text(doc: dict[str, Any]) -> str:
    """`doc` as TOML (which has no null: a None is left out), for structure-aware
    mutation of TOML files."""
    def kept(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: kept(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [kept(x) for x in v if x is not None]
        return v

    return tomli_w.dumps(kept(doc))


# Real files, as seeds: a conflist as pycri installs it, a registries.conf with a mirror
# and credentials-free search registries, a pycri config with every table used.
CONFLIST = json.loads((Path(__file__).resolve().parents[2] / "pycri/data/pycri-default.conflist")
                      .read_text().replace("@BRIDGE@", "cni0").replace("@SUBNET@", "10.88.0.0/16")
                      .replace("@DEFAULT_ROUTE@", "0.0.0.0/0"))
REGISTRIES_DOC: dict[str, Any] = {
    "unqualified-search-registries": ["127.0.0.1:5000"],
    "registry": [{"prefix": "docker.io", "location": "127.0.0.1:5000", "insecure": True,
                  "blocked": False, "mirror": [{"location": "127.0.0.1:5001",
                                                "insecure": True}]}],
}
CONFIG_DOC: dict[str, Any] = {
    "log_level": "info", "cgroup_driver": "cgroupfs", "default_runtime": "runc",
    "runtimes": {"runc": {"path": "/usr/sbin/runc", "timeout": 60.0}},
    "cni": {"plugin_timeout": 30.0, "conf_dir": "/etc/cni/net.d"},
    "images": {"max_concurrent_pulls": 32},
    "streaming": {"max_buffer_total": 134217728},
    "metrics": {"max_connections": 64},
}
_CNI_KEYS = ("cniVersion", "name", "plugins", "type", "bridge", "ipam", "ranges", "subnet",
             "capabilities", "portMappings", "disableCheck", SECRET)
_REG_KEYS = ("unqualified-search-registries", "registry", "prefix", "location", "mirror",
             "insecure", "blocked", "short-name-mode", "aliases", SECRET)
# A key pycri's config does not know is named in its error (that is the error), so the
# secret goes into values only.
_CONFIG_KEYS = ("log_level", "root", "state", "runtimes", "cni", "images", "streaming",
                "metrics", "nri", "cdi", "checkpoint", "bogus", "path", "timeout")
_CONFIG_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(_CONFIG_KEYS), inner,
                                                 max_size=4)), max_leaves=30)


def conflists() -> st.SearchStrategy[bytes]:
    """The installed conflist, mutated in one to three places."""
    return mutated(CONFLIST, st.sampled_from(_CNI_KEYS)).map(
        lambda d: json.dumps(d, allow_nan=True).encode())


def registries_texts() -> st.SearchStrategy[bytes]:
    """A real registries.conf, mutated in one to three places, as TOML."""
    return mutated(REGISTRIES_DOC, st.sampled_from(_REG_KEYS)).map(
        lambda d: toml_text(d).encode() if isinstance(d, dict) else b"")


def config_documents() -> st.SearchStrategy[bytes]:
    """A real pycri config, mutated in one to three places, as TOML."""
    return mutated(CONFIG_DOC, st.sampled_from(_CONFIG_KEYS), _CONFIG_VALUES).map(
        lambda d: toml_text(d).encode() if isinstance(d, dict) else b"")


def config_texts() -> st.SearchStrategy[bytes]:
    """TOML of known tables and keys given generated values, or generated bytes. (A
    key the schema does not know is named in its error: that is the error.)"""
    tables = st.sampled_from(["", "[cni]\n", "[cdi]\n", "[nri]\n", "[metrics]\n",
                              "[streaming]\n", "[checkpoint]\n", "[images]\n"])
    keys = st.sampled_from(["root", "log_level", "plugin_timeout", "spec_dirs",
                            "max_spec_bytes", "request_timeout", "header_timeout",
                            "max_connections", "timeout", "registries_conf", "bogus"])
    values = st.sampled_from(["nan", "inf", "-inf", "0", "-1", "1e308", "9223372036854775807",
                              f'"{SECRET}"', f'["{SECRET}"]', f"'/{SECRET}'", "true", "{}",
                              f'"{SECRET}', "[[]]", '"\\u0000"'])
    line = st.builds(lambda t, k, v: f"{t}{k} = {v}\n".encode(), tables, keys, values)
    return st.one_of(st.lists(line, min_size=1, max_size=4).map(b"".join),
                     st.binary(max_size=200).map(lambda b: b + SECRET.encode()))


def requests() -> st.SearchStrategy[bytes]:
    """Request heads: the corpus's, cut and spliced with generated bytes."""
    known = st.sampled_from([r for r, _ in REQUESTS.values() if r])
    return st.one_of(
        st.builds(lambda r, i, junk: r[:i] + junk + r[i:], known, st.integers(0, 60),
                  st.binary(max_size=40)),
        st.builds(lambda m, p, h: b"%s %s HTTP/1.1\r\n%s\r\n" % (m, p, h),
                  st.sampled_from([b"GET", b"HEAD", b"PUT", b"", b"G\x00T"]),
                  st.binary(max_size=30), st.binary(max_size=80)),
    )
