"""seccomp.py: bundled default profile, loader forms, capability gating."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci.seccomp import (
    DEFAULT_PROFILE_PATH,
    default_profile,
    for_capabilities,
    load_profile,
)
from pycri.oci.spec.capabilities import DEFAULT_CAPABILITIES

SP = pb.SecurityProfile


def allowed(profile: dict[str, Any]) -> set[str]:
    """Names allowed unconditionally (rules without argument filters)."""
    return {
        n
        for r in profile["syscalls"]
        if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args")
        for n in r["names"]
    }


def test_default_profile_shape() -> None:
    p = default_profile()
    assert p["defaultAction"] == "SCMP_ACT_ERRNO"
    assert p["defaultErrnoRet"] == 1
    assert set(p["architectures"]) == {
        "SCMP_ARCH_X86_64",
        "SCMP_ARCH_X86",
        "SCMP_ARCH_X32",
        "SCMP_ARCH_AARCH64",
        "SCMP_ARCH_ARM",
    }


def test_default_caps_allow_ordinary_and_block_dangerous() -> None:
    p = for_capabilities(default_profile(), DEFAULT_CAPABILITIES)
    ok = allowed(p)
    for name in ("read", "write", "openat", "execve", "mmap", "futex", "exit_group"):
        assert name in ok, name
    # socket() is allowed for every family but AF_VSOCK (40): no host/VM vsock services.
    assert "socket" not in ok
    socket_rules = [r for r in p["syscalls"] if r["names"] == ["socket"]]
    assert socket_rules == [{"names": ["socket"], "action": "SCMP_ACT_ALLOW",
                             "args": [{"index": 0, "value": 40, "op": "SCMP_CMP_NE"}]}]
    for name in (
        "unshare", "mount", "umount2", "setns", "sethostname", "keyctl", "add_key",
        "bpf", "kexec_load", "ptrace", "init_module", "reboot", "open_by_handle_at",
    ):  # fmt: skip
        assert name not in ok, name
    assert "chroot" in ok  # CAP_SYS_CHROOT is a default capability


def test_clone_restricted_and_clone3_enosys_without_sys_admin() -> None:
    p = for_capabilities(default_profile(), DEFAULT_CAPABILITIES)
    clone = [r for r in p["syscalls"] if "clone" in r["names"]]
    assert len(clone) == 1
    assert clone[0]["args"][0]["op"] == "SCMP_CMP_MASKED_EQ"
    assert clone[0]["args"][0]["value"] == 0x7E020000
    clone3 = [r for r in p["syscalls"] if "clone3" in r["names"]]
    assert clone3 == [{"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]


def test_sys_admin_unlocks_namespace_calls() -> None:
    p = for_capabilities(default_profile(), [*DEFAULT_CAPABILITIES, "CAP_SYS_ADMIN"])
    ok = allowed(p)
    assert {"unshare", "mount", "setns", "sethostname", "clone", "clone3", "bpf"} <= ok
    assert not [r for r in p["syscalls"] if r.get("args") and "clone" in r["names"]]
    assert "keyctl" not in ok


def test_ptrace_and_bpf_gates() -> None:
    assert "ptrace" in allowed(for_capabilities(default_profile(), ["CAP_SYS_PTRACE"]))
    assert "bpf" in allowed(for_capabilities(default_profile(), ["CAP_BPF"]))
    assert "bpf" not in allowed(for_capabilities(default_profile(), ["CAP_SYS_PTRACE"]))


def test_extension_keys_stripped_and_base_untouched() -> None:
    base = default_profile()
    before = json.dumps(base, sort_keys=True)
    out = for_capabilities(base, [])
    assert json.dumps(base, sort_keys=True) == before
    for r in out["syscalls"]:
        assert "capabilities" not in r and "unlessCapabilities" not in r


def test_bundled_json_has_no_duplicate_unconditional_names() -> None:
    raw = json.loads(DEFAULT_PROFILE_PATH.read_text())
    names = [n for r in raw["syscalls"] if not r.get("args") and not r.get("capabilities")
             and not r.get("unlessCapabilities") for n in r["names"]]  # fmt: skip
    assert len(names) == len(set(names))


def test_load_runtime_default_and_unconfined() -> None:
    assert load_profile(SP(profile_type=SP.RuntimeDefault), "") == default_profile()
    assert load_profile(SP(profile_type=SP.Unconfined), "runtime/default") is None


def test_load_nothing_set_is_unconfined() -> None:
    assert load_profile(None, "") is None


@pytest.mark.parametrize("legacy", ["runtime/default", "docker/default"])
def test_legacy_default(legacy: str) -> None:
    assert load_profile(None, legacy) == default_profile()


def test_legacy_unconfined_and_unknown() -> None:
    assert load_profile(None, "unconfined") is None
    with pytest.raises(InvalidArgument, match="'bogus'"):
        load_profile(None, "bogus")


def test_localhost_profile(tmp_path: Path) -> None:
    prof = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["sethostname"], "action": "SCMP_ACT_ERRNO"}]}  # fmt: skip
    f = tmp_path / "p.json"
    f.write_text(json.dumps(prof))
    assert load_profile(SP(profile_type=SP.Localhost, localhost_ref=str(f)), "") == prof
    assert load_profile(None, f"localhost/{f}") == prof


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"syscalls": []}', "defaultAction"),
        ('{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": {}}', "must be a list"),
        ('{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": [1], "action": "X"}]}',
         "names must be strings"),
    ],
)  # fmt: skip
def test_localhost_bad_file_names_path(tmp_path: Path, content: str | None, message: str) -> None:
    f = tmp_path / "bad.json"
    if content is not None:
        f.write_text(content)
    with pytest.raises(InvalidArgument, match=message) as e:
        load_profile(SP(profile_type=SP.Localhost, localhost_ref=str(f)), "")
    assert str(f) in str(e.value)


def test_localhost_relative_path_rejected() -> None:
    with pytest.raises(InvalidArgument, match="absolute"):
        load_profile(SP(profile_type=SP.Localhost, localhost_ref="profiles/x.json"), "")


def test_localhost_unreadable_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=str(tmp_path)):
        load_profile(SP(profile_type=SP.Localhost, localhost_ref=str(tmp_path)), "")


def _load_in_thread(path: Path) -> list[BaseException | dict[str, Any] | None]:
    """Load a Localhost profile in a thread; [] if it still blocks after a generous wait."""
    out: list[BaseException | dict[str, Any] | None] = []

    def run() -> None:
        try:
            out.append(load_profile(SP(profile_type=SP.Localhost, localhost_ref=str(path)), ""))
        except BaseException as e:  # handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    return out


def test_localhost_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """Issue 8 defect 8: open() of a FIFO profile blocked until someone wrote to it."""
    fifo = tmp_path / "profile.json"
    os.mkfifo(fifo)
    try:
        out = _load_in_thread(fifo)
    finally:  # release a blocked reader (before the fix), so the thread ends
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert out, "loading a FIFO profile blocked"
    assert isinstance(out[0], InvalidArgument)
    assert f"seccomp profile {fifo}: is a FIFO, not a regular file" in str(out[0])


def test_localhost_device_and_oversized_are_refused(tmp_path: Path) -> None:
    dev = tmp_path / "dev.json"
    os.mknod(dev, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: endless
    with pytest.raises(InvalidArgument, match="is a character device, not a regular file"):
        load_profile(SP(profile_type=SP.Localhost, localhost_ref=str(dev)), "")
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate((1 << 20) + 1)
    with pytest.raises(InvalidArgument, match="larger than 1048576 bytes"):
        load_profile(SP(profile_type=SP.Localhost, localhost_ref=str(big)), "")
    # issue 41: deep nesting was an INTERNAL RecursionError
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InvalidArgument, match="nests deeper than 64 levels"):
        load_profile(SP(profile_type=SP.Localhost, localhost_ref=str(deep)), "")
