"""Whether this node can checkpoint (pycri/criu/support.py), asked of the real criu
and runtimes, with failures injected through stand-in binaries: a missing criu, one whose
`check` fails with CRIU's own words, one that hangs; answers cached, probes off the loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycri import config as config_mod
from pycri.api import api_pb2 as pb
from pycri.check import run_checks
from pycri.config import CheckpointConfig, Config, ConfigError
from pycri.criu.support import CheckpointSupport, probe_criu, probe_runtime
from pycri.errors import FailedPrecondition, InvalidArgument
from pycri.gate import check_request

FAILING_CRIU = """#!/bin/sh
echo "$@" >> {calls}
case "$1" in
--version) echo "Version: 9.9" ;;
check) echo "Error (criu/kerndat.c:1): no time namespace here" >&2; exit 1 ;;
esac
"""


def script(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def failing_criu(tmp: Path) -> tuple[str, Path]:
    calls = tmp / "calls"
    return script(tmp, "criu", FAILING_CRIU.format(calls=calls)), calls


def support(criu: str, timeout: float = 30.0) -> CheckpointSupport:
    return CheckpointSupport(Config(checkpoint=CheckpointConfig(criu=criu,
                                                                check_timeout=timeout)))


async def test_a_missing_criu_binary_is_named(tmp_path: Path) -> None:
    probe = await probe_criu(CheckpointConfig(criu=str(tmp_path / "nope")))
    assert probe.problem is not None
    assert f"the criu binary {tmp_path / 'nope'} is not there" in probe.problem
    assert "apt-get install criu" in probe.problem


async def test_a_failing_criu_check_gives_criu_s_reason(tmp_path: Path) -> None:
    criu, _ = failing_criu(tmp_path)
    probe = await probe_criu(CheckpointConfig(criu=criu))
    assert probe.problem == (f"`{criu} check` fails on this host (criu 9.9): "
                             "no time namespace here")


async def test_a_hanging_criu_check_is_cut_off_and_asked_again(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    criu = script(tmp_path, "criu", f'#!/bin/sh\necho "$1" >> {calls}\nexec sleep 30\n')
    started = time.monotonic()
    probe = await probe_criu(CheckpointConfig(criu=criu, check_timeout=0.5))
    assert time.monotonic() - started < 5
    assert probe.problem == f"`{criu} check` did not answer within 0.5s"
    s = support(criu, timeout=0.5)
    for _ in range(2):  # a busy host's silence is not remembered as its answer
        with pytest.raises(FailedPrecondition, match=r"did not answer within 0\.5s"):
            await s.require("runc")
    assert calls.read_text().split().count("--version") == 3


async def test_the_real_criu_on_this_host_answers() -> None:
    """Whatever this host's criu says, it is said as a version or as criu's own reason."""
    probe = await probe_criu(CheckpointConfig())
    if probe.problem is None:
        assert probe.detail.startswith("criu ")
    else:
        assert "/usr/sbin/criu" in probe.problem


async def test_runtimes_report_their_checkpoint_support() -> None:
    runc = await probe_runtime("runc", "/usr/sbin/runc", 30)
    assert runc.problem is None and runc.detail.startswith("runc version")
    crun = await probe_runtime("crun", "/usr/bin/crun", 30)
    if "+CRIU" in crun.detail or crun.problem is None:
        assert crun.problem is None
    else:
        assert crun.problem == (f"runtime handler 'crun' ({crun.detail}) was built without "
                                "CRIU (no +CRIU in `crun --version`)")


async def test_a_runtime_without_a_checkpoint_command_is_named(tmp_path: Path) -> None:
    rt = script(tmp_path, "rt", '#!/bin/sh\n[ "$1" = --version ] && echo "rt 1.0" && exit 0\n'
                "echo 'unknown command checkpoint' >&2; exit 1\n")
    probe = await probe_runtime("rt", rt, 30)
    assert probe.problem == ("runtime handler 'rt' (rt 1.0) has no checkpoint command: "
                             "unknown command checkpoint")


async def test_require_names_every_missing_part_and_probes_once(tmp_path: Path) -> None:
    criu, calls = failing_criu(tmp_path)
    s = support(criu)
    for _ in range(3):
        with pytest.raises(FailedPrecondition) as e:
            await asyncio.gather(s.require("crun"), s.require("crun"))
        message = str(e.value)
        assert message.startswith("checkpoint/restore cannot work on this node: ")
        assert "no time namespace here" in message
    assert calls.read_text().split("\n").count("check") == 1  # cached, concurrent calls share
    crun = await probe_runtime("crun", "/usr/bin/crun", 30)
    assert (crun.problem or "") in message


async def test_probes_do_not_block_the_event_loop(tmp_path: Path) -> None:
    criu = script(tmp_path, "criu", "#!/bin/sh\nsleep 1\nexit 1\n")
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticker = asyncio.ensure_future(tick())
    try:
        with pytest.raises(FailedPrecondition):
            await support(criu).require("runc")
    finally:
        ticker.cancel()
    assert ticks >= 20  # ~2 s of probes (version and check), the loop ticking throughout


def test_pycri_check_reports_criu_and_each_runtime(tmp_path: Path) -> None:
    criu, _ = failing_criu(tmp_path)
    results = {c.name: c for c in run_checks(Config(checkpoint=CheckpointConfig(criu=criu)))}
    criu_check = results["checkpoint/restore (CRIU)"]
    assert not criu_check.ok and "no time namespace here" in criu_check.detail
    assert "FailedPrecondition" in criu_check.fix
    assert results["checkpoint with runc"].ok


def test_pycri_check_warns_but_does_not_fail_for_checkpointing(tmp_path: Path) -> None:
    """A node without CRIU is a good CRI node: the CLI says [warn], and its exit status
    still reflects only the checks a node needs."""
    criu, _ = failing_criu(tmp_path)
    config = tmp_path / "pycri.toml"
    config.write_text(f'[checkpoint]\ncriu = "{criu}"\n')
    out = subprocess.run([sys.executable, "-m", "pycri", "check", "--config", str(config)],
                         capture_output=True, text=True, timeout=120)
    assert "[warn] checkpoint/restore (CRIU): " in out.stdout
    assert "no time namespace here" in out.stdout
    assert out.returncode == (1 if "[FAIL]" in out.stdout else 0), out.stdout


def test_check_timeout_must_be_positive(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[checkpoint]\ncheck_timeout = 0\n")
    with pytest.raises(ConfigError, match=r"checkpoint\.check_timeout: must be within 1\.\."):
        config_mod.validate(config_mod.load(path), check_binaries=False)
    path.write_text('[checkpoint]\ncriu = "/opt/criu/bin/criu"\n')
    assert config_mod.load(path).checkpoint.criu == "/opt/criu/bin/criu"


@pytest.mark.parametrize(("request_", "message"), [
    (pb.CheckpointContainerRequest(location="/tmp/c.tar"), "container_id: must be set"),
    (pb.CheckpointContainerRequest(container_id="abc"), "location: must be set"),
    (pb.CheckpointContainerRequest(container_id="abc", location="c.tar"),
     "location: must be an absolute, normalised path naming a file"),
    (pb.CheckpointContainerRequest(container_id="abc", location="/tmp/../etc/c.tar"),
     "location: must be an absolute, normalised path"),
    (pb.CheckpointContainerRequest(container_id="abc", location="/tmp/dir/"),
     "location: must be an absolute, normalised path"),
    (pb.CheckpointContainerRequest(container_id="abc", location="/"),
     "location: must be an absolute, normalised path"),
    (pb.CheckpointContainerRequest(container_id="abc", location="/tmp/c\x00.tar"),
     "location: contains a NUL byte"),
    (pb.CheckpointContainerRequest(container_id="abc", location="/tmp/c.tar", timeout=-1),
     "timeout: -1 is outside"),
    (pb.CheckpointContainerRequest(container_id="a/b", location="/tmp/c.tar"),
     "container_id: must be letters"),
    (pb.CheckpointPodRequest(output_path="/tmp/p.tar"), "pod_sandbox_id: must be set"),
    (pb.CheckpointPodRequest(pod_sandbox_id="abc", output_path="rel/p.tar"),
     "output_path: must be an absolute"),
    (pb.CheckpointPodRequest(pod_sandbox_id="abc", output_path="/tmp/p.tar",
                             container_ids=["../x"]), "container_ids[0]: must be letters"),
    (pb.RestorePodRequest(), "checkpoint_path: must be set"),
    (pb.RestorePodRequest(checkpoint_path="./p.tar"), "checkpoint_path: must be an absolute"),
], ids=lambda v: None if isinstance(v, str) else str(v).replace("\n", " ")[:60])
def test_bad_checkpoint_requests_are_refused_naming_the_field(
    request_: object, message: str
) -> None:
    with pytest.raises(InvalidArgument) as e:
        check_request(request_)  # type: ignore[arg-type]
    assert message in str(e.value)


def test_good_checkpoint_requests_pass_the_gate() -> None:
    check_request(pb.CheckpointContainerRequest(container_id="abc", location="/tmp/c.tar",
                                                timeout=30))
    check_request(pb.CheckpointPodRequest(pod_sandbox_id="abc", output_path="/tmp/p.tar",
                                          container_ids=["def"]))
    check_request(pb.RestorePodRequest(checkpoint_path="/tmp/p.tar"))
