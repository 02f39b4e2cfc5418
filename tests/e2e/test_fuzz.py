"""Structured fuzzing of every CRI request against a live daemon (bounded for CI).

hack/fuzz.py runs the same generator for as long as you like; see tests/lib/fuzz.py for
the generator, what keeps requests away from the host, and the oracle.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lib import fuzz
from tests.lib.registry import Registry

pytestmark = pytest.mark.e2e

REQUESTS = int(os.environ.get("PYCRI_FUZZ_REQUESTS", "300"))

# Findings that belong to the validation gate (pycri/server/validate.py) being built in
# parallel, by substring of the finding key. TEMPORARY: while any is listed the test
# xfails (strict=False) instead of failing; delete each once the gate refuses it.
KNOWN_VALIDATION_FINDINGS = [
    "ValueError: embedded null byte",  # NUL in names, paths, hostnames (issue 8 #6)
    "Argument list too long",  # a 1 MiB pod name or namespace reaches CNI_ARGS
    "is not in a separate kernel namespace",  # unknown sysctl names reach runc
    "json: cannot unmarshal number",  # negative or huge resource values reach runc
    "maximum allowed cpu-shares",
    "cannot use unified on cgroup",
    "Setting back cgroup configs failed",  # cpuset strings reach runc
    "unable to apply cgroup configuration",  # cpuset/quota values reach runc
    "error setting cgroup config",
    "unable to get cgroup freezer state",  # NUL or odd cgroup_parent reaches runc
    "cannot toggle freezer",
    "sethostname: invalid argument",  # hostname over 64 bytes (issue 8 #15)
    "File name too long",  # a 256-byte log_directory component
    "additionalGids",  # supplemental group over uint32
    "environment variable value can't contain",  # NUL in an env value
    "executable file not found",  # ExecSync of a missing program is UNKNOWN
    "registry answered 500",  # a repository name the registry refuses
]


@pytest.fixture
def fuzz_node(tmp_path: Path, registry: Registry, busybox: str) -> Iterator[fuzz.FuzzNode]:
    bridge = f"pcfz{secrets.token_hex(3)}"
    node = fuzz.start_node(tmp_path / "node", busybox, registry.addr, bridge,
                           f"10.196.{secrets.randbelow(250)}.0/24")
    try:
        yield node
    finally:
        status = fuzz.stop_node(node, tmp_path / "node")
        assert status == 0, node.proc.log_text()[-3000:]


def test_fuzz_every_rpc(fuzz_node: fuzz.FuzzNode, tmp_path: Path) -> None:
    """A few hundred generated requests: no INTERNAL/UNKNOWN, no hang, no crash, the
    daemon answers Version within 1 s after every batch, nothing leaked at the end."""
    fz = fuzz.Fuzzer(fuzz_node.proc, fuzz_node.pool, fuzz_node.ipam,
                     f"e2e-{fuzz_node.bridge}")
    try:
        problems = fuzz.run(fz, REQUESTS, batch=50, seed=None)
        fz.remove_all()
        leaks = {k: v for k, v in fz.leaks(tmp_path / "node").items() if v}
    finally:
        fz.channel.close()
    report = fz.report()
    print(report)
    assert fz.sent >= REQUESTS, report
    assert not fz.harness_errors, report
    assert problems == [], report
    assert leaks == {}, f"{leaks}\n{report}"
    unknown = [k for k in fz.findings
               if not any(known in k or known in fz.findings[k].message
                          for known in KNOWN_VALIDATION_FINDINGS)]
    assert unknown == [], report
    if fz.findings:
        pytest.xfail("known validation findings (KNOWN_VALIDATION_FINDINGS): "
                     + "; ".join(sorted(fz.findings)))
