"""CDI spec files: versions and fields, JSON and YAML, priority, conflicts, changes."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from pycri.cdi import registry as reg
from pycri.cdi.schema import SpecError, parse_spec
from pycri.errors import InvalidArgument

NULL = os.stat("/dev/null")


def doc(version: str = "0.6.0", kind: str = "example.com/dev", **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"cdiVersion": version, "kind": kind,
                         "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}
    d.update(kw)
    return d


def write(d: Path, name: str, content: dict[str, Any] | str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    if isinstance(content, str):
        p.write_text(content)
    elif name.endswith(".json"):
        p.write_text(json.dumps(content))
    else:
        p.write_text(yaml.safe_dump(content))
    return p


def registry(*dirs: Path, max_bytes: int = 1 << 20, max_files: int = 256) -> reg.Registry:
    return reg.Registry([str(d) for d in dirs], max_bytes, max_files)


# -- versions and fields --------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0",
                                     "1.0.0", "1.0.1"])
def test_every_version_in_use_loads(version: str) -> None:
    assert parse_spec(doc(version, annotations={})).kind == "example.com/dev"


@pytest.mark.parametrize(("version", "why"), [
    ("1.1.0", "not supported"), ("0.2.0", "not supported"), ("latest", "expected a version"),
    (6, "expected a version")])
def test_unknown_versions_are_refused(version: Any, why: str) -> None:
    with pytest.raises(SpecError, match=why):
        parse_spec(doc(version))


def edits_doc(version: str, edits: dict[str, Any], name: str = "a") -> dict[str, Any]:
    return {"cdiVersion": version, "kind": "example.com/dev",
            "devices": [{"name": name, "containerEdits": edits}]}


NEWER_FIELDS = [
    ("0.3.0", {"mounts": [{"hostPath": "/x", "containerPath": "/y", "type": "bind"}]},
     "devices[0].containerEdits.mounts[0].type: needs cdiVersion 0.4.0"),
    ("0.4.0", {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/null"}]},
     "deviceNodes[0].hostPath: needs cdiVersion 0.5.0"),
    ("0.6.0", {"additionalGids": [5]}, "additionalGids: needs cdiVersion 0.7.0"),
    ("0.6.0", {"intelRdt": {"closID": "c"}}, "intelRdt: needs cdiVersion 0.7.0"),
]


@pytest.mark.parametrize(("version", "edits", "message"), NEWER_FIELDS)
def test_a_field_newer_than_the_files_version_is_refused(
    version: str, edits: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=message.replace(".", r"\.").replace("[", r"\[")):
        parse_spec(edits_doc(version, edits))
    bumped = {"0.3.0": "0.4.0", "0.4.0": "0.5.0", "0.6.0": "0.7.0"}[version]
    parse_spec(edits_doc(bumped, edits))


def test_version_gated_names_and_annotations() -> None:
    with pytest.raises(SpecError, match=r"starting with a digit.*0\.5\.0"):
        parse_spec(edits_doc("0.4.0", {"env": ["A=1"]}, name="0"))
    parse_spec(edits_doc("0.5.0", {"env": ["A=1"]}, name="0"))
    with pytest.raises(SpecError, match=r"a '\.' in the class.*0\.6\.0"):
        parse_spec(doc("0.5.0", kind="example.com/dev.x"))
    with pytest.raises(SpecError, match=r"annotations: needs cdiVersion 0\.6\.0"):
        parse_spec(doc("0.5.0", annotations={"a": "b"}))


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.update(extra=1), r"spec: unknown field \(its field 4; known: cdiVersion, kind"),
    (lambda d: d.update(devices=[]), "at least one device"),
    (lambda d: d.update(kind="nokind"), "kind: expected vendor/class"),
    (lambda d: d["devices"].append(d["devices"][0]),
     r"devices\[1\]\.name: defined before, by devices\[0\]"),
    (lambda d: d["devices"][0].update(name="a/b"),
     r"devices\[0\]\.name: expected a device name starting"),
    (lambda d: d["devices"][0]["containerEdits"].update(env=["NOEQUALS"]), "expected NAME=value"),
    (lambda d: d["devices"][0]["containerEdits"].update(netDevices=[]),
     "containerEdits: unknown field"),
    (lambda d: d["devices"][0]["containerEdits"].update(
        deviceNodes=[{"path": "dev/x"}]), "path: expected an absolute path"),
    (lambda d: d["devices"][0]["containerEdits"].update(
        deviceNodes=[{"path": "/dev/x", "permissions": "rwx"}]), "expected letters of 'rwm'"),
    (lambda d: d["devices"][0]["containerEdits"].update(
        deviceNodes=[{"path": "/dev/x", "type": "z"}]), "type: expected one of b, c, u, p"),
    (lambda d: d["devices"][0]["containerEdits"].update(
        hooks=[{"hookName": "prestop", "path": "/bin/true"}]),
     "hookName: expected one of prestart,"),
    (lambda d: d["devices"][0]["containerEdits"].update(
        hooks=[{"hookName": "poststop", "path": "/bin/true", "timeout": 0}]), "timeout"),
    (lambda d: d["devices"][0]["containerEdits"].update(
        mounts=[{"containerPath": "/x"}]), r"mounts\[0\]\.hostPath: expected a string"),
    (lambda d: d["devices"][0]["containerEdits"].update(env="A=1"), "expected an array"),
])
def test_malformed_specs_name_the_field(mutate: Any, message: str) -> None:
    d = doc()
    mutate(d)
    with pytest.raises(SpecError, match=message):
        parse_spec(d)


# -- the registry ---------------------------------------------------------------------


FULL = {
    "cdiVersion": "0.7.0", "kind": "example.com/dev",
    "containerEdits": {"env": ["SPEC=1"], "additionalGids": [0, 44]},
    "devices": [
        {"name": "null", "containerEdits": {
            "deviceNodes": [{"path": "/dev/cdi-null", "hostPath": "/dev/null"}],
            "mounts": [{"hostPath": "/etc", "containerPath": "/cdi-etc",
                        "options": ["rbind", "ro"]}],
            "hooks": [{"hookName": "createContainer", "path": "/bin/true", "args": ["true"]}],
            "env": ["DEV=null"]}},
        {"name": "other", "containerEdits": {"env": ["DEV=other"]}},
    ],
}


@pytest.mark.parametrize("name", ["vendor.json", "vendor.yaml"])
def test_json_and_yaml_resolve_alike_with_host_facts_filled(tmp_path: Path, name: str) -> None:
    write(tmp_path, name, FULL)
    edits = registry(tmp_path).resolve(["example.com/dev=null"])
    assert [e.env for e in edits] == [("SPEC=1",), ("DEV=null",)]  # spec's first, then device's
    (node,) = edits[1].device_nodes
    assert (node.type, node.major, node.minor) == ("c", os.major(NULL.st_rdev),
                                                   os.minor(NULL.st_rdev))
    assert node.path == "/dev/cdi-null" and node.file_mode == NULL.st_mode & 0o7777


def test_spec_edits_come_once_for_two_devices_of_one_spec(tmp_path: Path) -> None:
    write(tmp_path, "v.json", FULL)
    edits = registry(tmp_path).resolve(["example.com/dev=other", "example.com/dev=null",
                                        "example.com/dev=other"])
    assert [e.env for e in edits] == [("SPEC=1",), ("DEV=other",), ("DEV=null",)]


def test_unknown_device_and_kind_are_named(tmp_path: Path) -> None:
    write(tmp_path, "v.json", FULL)
    r = registry(tmp_path, tmp_path / "absent")
    for device in ("example.com/dev=nope", "other.com/x=null"):
        with pytest.raises(InvalidArgument, match=f"unknown CDI device {device}: no spec file"):
            r.resolve([device])


def test_a_malformed_file_is_named_for_its_kind_and_unknown_devices(tmp_path: Path) -> None:
    write(tmp_path, "good.json", FULL)
    bad = write(tmp_path, "bad.yaml", {**FULL, "kind": "broken.com/x", "extra": 1})
    unparsable = write(tmp_path, "junk.json", "{not json")
    r = registry(tmp_path)
    assert len(r.resolve(["example.com/dev=null"])) == 2  # other kinds are unaffected
    with pytest.raises(InvalidArgument, match=f"invalid spec file {bad}: spec: unknown field"):
        r.resolve(["broken.com/x=null"])
    with pytest.raises(InvalidArgument, match=f"unreadable spec files: {unparsable}: not valid"):
        r.resolve(["example.com/dev=nope"])


def test_two_files_of_one_dir_defining_a_device_conflict(tmp_path: Path) -> None:
    a, b = write(tmp_path, "a.json", FULL), write(tmp_path, "b.yaml", FULL)
    with pytest.raises(InvalidArgument, match=f"more than one spec file: {a}, {b}"):
        registry(tmp_path).resolve(["example.com/dev=null"])


def test_later_dirs_override_earlier(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    write(etc, "v.json", FULL)
    override = {**FULL, "containerEdits": {}, "devices": [
        {"name": "null", "containerEdits": {"env": ["FROM=run"]}}]}
    write(run, "v.yaml", override)
    edits = registry(etc, run).resolve(["example.com/dev=null", "example.com/dev=other"])
    # null comes from run/ (its spec has no spec-level env); other is only in etc/
    assert [e.env for e in edits] == [(), ("FROM=run",), ("SPEC=1",), ("DEV=other",)]


def test_a_changed_file_is_reread_an_unchanged_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = write(tmp_path, "v.json", FULL)
    r = registry(tmp_path)
    loads: list[str] = []
    real = r._load
    monkeypatch.setattr(r, "_load", lambda path, sig: loads.append(path) or real(path, sig))
    r.resolve(["example.com/dev=other"])
    r.resolve(["example.com/dev=other"])
    assert loads == [str(p)]
    changed = {**FULL, "devices": [{"name": "other", "containerEdits": {"env": ["NEW=1"]}}]}
    p.write_text(json.dumps(changed))  # a new size (and mtime)
    assert r.resolve(["example.com/dev=other"])[1].env == ("NEW=1",)
    assert loads == [str(p), str(p)]
    p.unlink()
    with pytest.raises(InvalidArgument, match="unknown CDI device"):
        r.resolve(["example.com/dev=other"])


def test_bounds_on_file_size_count_and_yaml_aliases(tmp_path: Path) -> None:
    big = write(tmp_path / "big", "v.json", {**FULL, "annotations": {"pad": "x" * 2000}})
    with pytest.raises(InvalidArgument, match=f"{big}: larger than 1000 bytes"):
        registry(tmp_path / "big", max_bytes=1000).resolve(["example.com/dev=null"])
    for i in range(3):
        write(tmp_path / "many", f"{i}.json", FULL)
    with pytest.raises(InvalidArgument, match="more than 2 spec files"):
        registry(tmp_path / "many", max_files=2).resolve(["example.com/dev=null"])
    bomb = "a: &a [" + ",".join(["x"] * 50) + "]\n"
    for c in "bcde":
        prev = chr(ord(c) - 1)
        bomb += f"{c}: &{c} [" + ",".join([f"*{prev}"] * 50) + "]\n"
    with pytest.raises(SpecError, match="YAML aliases"):
        reg.decode("bomb.yaml", bomb.encode())
    for name in ("deep.json", "deep.yaml"):
        with pytest.raises(SpecError, match="nested too deeply"):
            reg.decode(name, b"[" * 200_000 + b"]" * 200_000)


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    write(tmp_path, "v.json", FULL)
    os.mkfifo(tmp_path / "fifo.json")  # opening it for reading would block
    (tmp_path / "dir.yaml").mkdir()
    (tmp_path / "notes.txt").write_text("{not a spec")
    (tmp_path / "link.yaml").symlink_to(tmp_path / "v.json")  # followed: same devices
    r = registry(tmp_path)
    with pytest.raises(InvalidArgument, match="more than one spec file"):
        r.resolve(["example.com/dev=null"])
    (tmp_path / "link.yaml").unlink()
    assert len(r.resolve(["example.com/dev=null"])) == 2


def test_device_node_type_mismatch_and_missing_host_node(tmp_path: Path) -> None:
    nodes = [{"name": "blk", "containerEdits": {"deviceNodes": [
                 {"path": "/dev/x", "hostPath": "/dev/null", "type": "b"}]}},
             {"name": "gone", "containerEdits": {"deviceNodes": [{"path": "/dev/pycri-gone"}]}},
             {"name": "given", "containerEdits": {"deviceNodes": [
                 {"path": "/dev/pycri-gone", "type": "c", "major": 1, "minor": 3}]}}]
    write(tmp_path, "v.json", {**FULL, "devices": nodes})
    r = registry(tmp_path)
    with pytest.raises(InvalidArgument, match=r"type 'b' in the spec but 'c' on the host"):
        r.resolve(["example.com/dev=blk"])
    with pytest.raises(InvalidArgument, match=r"dev=gone: device node /dev/pycri-gone"):
        r.resolve(["example.com/dev=gone"])
    (node,) = r.resolve(["example.com/dev=given"])[1].device_nodes
    assert (node.major, node.minor, node.file_mode) == (1, 3, None)  # no host read needed


def test_resolves_from_many_threads(tmp_path: Path) -> None:
    write(tmp_path, "v.json", FULL)
    r = registry(tmp_path)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(50):
                assert len(r.resolve(["example.com/dev=null"])) == 2
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_link_to_a_secret_file_is_named_never_quoted(tmp_path: Path) -> None:
    """Issue 22, defect 7: a spec dir entry linking to /etc/shadow put its first line
    into the client's error (YAML read `root:<hash>:...:` as an unknown field)."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$y$j9T$s3cr3tHash:20228:0:99999:7:::\n"
                      "daemon:*:20228:0:99999:7:::\n")
    d = tmp_path / "cdi"
    d.mkdir()
    for name in ("evil.yaml", "evil.json"):
        (d / name).symlink_to(secret)
    with pytest.raises(InvalidArgument) as e:
        registry(d).resolve(["example.com/dev=a"])
    assert "s3cr3t" not in str(e.value) and "root:" not in str(e.value), str(e.value)
    assert f"{d}/evil.yaml: " in str(e.value) and f"{d}/evil.json: " in str(e.value)
