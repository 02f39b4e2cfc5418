"""Specs from oci/spec/ run under real runc and crun with a busybox rootfs.

Each container runs in the foreground (`<runtime> run`), so stdout is the process's;
cgroups live under a unique parent that is removed at teardown.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from pycri.api import api_pb2 as pb
from pycri.devices import DeviceInfo
from pycri.oci import seccomp
from pycri.oci.spec.build import ContainerContext, SandboxContext, container_spec, sandbox_spec
from pycri.oci.spec.capabilities import (
    ALL_CAPABILITIES,
    DEFAULT_CAPABILITIES,
    capabilities_from_mask,
)
from pycri.oci.spec.image import ImageConfig
from pycri.oci.users import UserRequest, resolve_user_in_rootfs

RUNTIMES = {"runc": "/usr/sbin/runc", "crun": "/usr/bin/crun"}
BUSYBOX = "/usr/bin/busybox"
APPLETS = ("sh", "id", "cat", "grep", "ls", "touch", "unshare", "true", "hostname", "wc")
TIMEOUT = 30
SP = pb.SecurityProfile

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(BUSYBOX), reason="needs root and a static busybox"
)


@dataclass
class Runner:
    runtime: str
    binary: str
    state: Path
    work: Path
    cgroup_parent: str
    created: list[str] = field(default_factory=list)

    def rootfs(self, name: str) -> Path:
        root = self.work / name / "rootfs"
        (root / "bin").mkdir(parents=True)
        (root / "etc").mkdir()
        shutil.copy(BUSYBOX, root / "bin" / "busybox")
        for applet in APPLETS:
            os.symlink("busybox", root / "bin" / applet)
        (root / "etc" / "passwd").write_text(
            "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n"
        )
        (root / "etc" / "group").write_text("root:x:0:\nalice:x:1000:\nextra:x:2000:alice\n")
        return root

    def _cmd(self, *args: str) -> list[str]:
        return [self.binary, "--root", str(self.state), *args]

    def run(self, spec: dict[str, Any], cid: str) -> subprocess.CompletedProcess[str]:
        bundle = Path(spec["root"]["path"]).parent
        (bundle / "config.json").write_text(json.dumps(spec))
        self.created.append(cid)
        try:
            proc = subprocess.run(
                self._cmd("run", "--bundle", str(bundle), cid),
                capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            self.delete(cid)
        if self.runtime == "crun" and "hugetlb" in proc.stderr:
            pytest.skip(f"crun refuses this host's cgroup layout (hugetlb on v2): {proc.stderr}")
        return proc

    def start_detached(self, spec: dict[str, Any], cid: str) -> int:
        """`run --detach`: stdio must not be pipes, or the wait would last as long as the
        container does."""
        bundle = Path(spec["root"]["path"]).parent
        (bundle / "config.json").write_text(json.dumps(spec))
        self.created.append(cid)
        err_path = bundle / "run.err"
        with open(err_path, "w") as err:
            rc = subprocess.call(
                self._cmd("run", "--detach", "--bundle", str(bundle), cid),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, timeout=TIMEOUT,
            )  # fmt: skip
        if rc != 0:
            self.delete(cid)
            stderr = err_path.read_text()
            if self.runtime == "crun" and "hugetlb" in stderr:
                pytest.skip(f"crun refuses this host's cgroup layout: {stderr}")
            raise AssertionError(f"{self.runtime} run -d failed: {stderr}")
        state = subprocess.run(self._cmd("state", cid), capture_output=True, text=True, check=True)
        return int(json.loads(state.stdout)["pid"])

    def delete(self, cid: str) -> None:
        subprocess.run(self._cmd("delete", "--force", cid), capture_output=True, timeout=TIMEOUT)


def _remove_cgroup_parent(parent: str) -> None:
    """rmdir the test's cgroup tree in every hierarchy; a killed process may take a
    moment to leave its cgroup, so retry briefly."""
    for ctrl in os.listdir("/sys/fs/cgroup"):
        top = os.path.join("/sys/fs/cgroup", ctrl, parent.lstrip("/"))
        if not os.path.isdir(top):
            continue
        dirs = [d for d, _, _ in os.walk(top)]
        for d in reversed(dirs):
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY:
                        raise
                    time.sleep(0.05)
            else:
                raise AssertionError(f"cgroup {d} still busy")


@pytest.fixture(params=sorted(RUNTIMES))
def runner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runner]:
    name = request.param
    if not os.access(RUNTIMES[name], os.X_OK):
        pytest.skip(f"{RUNTIMES[name]} not installed")
    parent = f"/pycri-test-{uuid.uuid4().hex[:8]}"
    state = tmp_path / "state"
    state.mkdir()
    r = Runner(name, RUNTIMES[name], state, tmp_path, parent)
    try:
        yield r
    finally:
        for cid in r.created:
            r.delete(cid)
        _remove_cgroup_parent(parent)


def config(*script: str) -> pb.ContainerConfig:
    cfg = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="t"), command=["/bin/sh", "-c", "; ".join(script)]
    )
    o = cfg.linux.security_context.namespace_options
    o.network, o.pid, o.ipc = pb.NODE, pb.CONTAINER, pb.CONTAINER
    return cfg


def sandbox() -> pb.PodSandboxConfig:
    sb = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", namespace="n", uid="u"))
    sb.linux.security_context.namespace_options.network = pb.NODE
    return sb


def run(
    r: Runner, cfg: pb.ContainerConfig, name: str = "c", req: UserRequest | None = None, **ctx: Any
) -> subprocess.CompletedProcess[str]:
    root = r.rootfs(name)
    cid = f"pycri-test-{uuid.uuid4().hex[:12]}"
    user = resolve_user_in_rootfs(str(root), req or UserRequest())
    context = ContainerContext(
        container_id=cid, sandbox_id="sb", rootfs=str(root), user=user,
        cgroup_parent=r.cgroup_parent, min_oom_score_adj=own_oom_score_adj(),
    )  # fmt: skip
    spec = container_spec(cfg, sandbox(), ImageConfig(), replace(context, **ctx))
    return r.run(spec, cid)


def own_oom_score_adj() -> int:
    return int(Path("/proc/self/oom_score_adj").read_text())


def own_capabilities() -> tuple[str, ...]:
    """Our bounding set: a container cannot get more (root here lacks CAP_SYS_RESOURCE)."""
    status = Path("/proc/self/status").read_text()
    return capabilities_from_mask(int(status_field(status, "CapBnd"), 16))


def cap_mask(caps: list[str] | tuple[str, ...]) -> int:
    return sum(1 << ALL_CAPABILITIES.index(c) for c in caps)


def status_field(out: str, key: str) -> str:
    for line in out.splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{key} not in {out!r}")


def test_user_and_groups(runner: Runner) -> None:
    cfg = config("id -u", "id -g", "id -G")
    p = run(runner, cfg, req=UserRequest(image_user="alice", supplemental_groups=[3000]))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:3] == ["1000", "1000", "1000 2000 3000"]


def test_run_as_user_and_group(runner: Runner) -> None:
    p = run(runner, config("id -u", "id -g"), req=UserRequest(run_as_user=4242, run_as_group=77))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["4242", "77"]


def test_default_capabilities(runner: Runner) -> None:
    p = run(runner, config("grep Cap /proc/self/status"))
    assert p.returncode == 0, p.stderr
    assert int(status_field(p.stdout, "CapEff"), 16) == cap_mask(DEFAULT_CAPABILITIES)
    assert int(status_field(p.stdout, "CapBnd"), 16) == cap_mask(DEFAULT_CAPABILITIES)


def test_added_and_dropped_capabilities(runner: Runner) -> None:
    cfg = config("grep Cap /proc/self/status")
    cfg.linux.security_context.capabilities.add_capabilities.append("NET_ADMIN")
    cfg.linux.security_context.capabilities.drop_capabilities.append("CHOWN")
    p = run(runner, cfg)
    assert p.returncode == 0, p.stderr
    expected = (set(DEFAULT_CAPABILITIES) | {"CAP_NET_ADMIN"}) - {"CAP_CHOWN"}
    assert int(status_field(p.stdout, "CapEff"), 16) == cap_mask(sorted(expected))


def test_readonly_rootfs(runner: Runner) -> None:
    cfg = config("touch /newfile && echo wrote || echo refused")
    assert run(runner, cfg, "rw").stdout.strip() == "wrote"
    cfg.linux.security_context.readonly_rootfs = True
    p = run(runner, cfg, "ro")
    assert p.stdout.strip() == "refused", p.stderr


def test_seccomp_runtime_default_blocks_unshare(runner: Runner) -> None:
    script = ("grep Seccomp: /proc/self/status", "unshare -U true && echo unshared || echo blocked")
    profile = seccomp.load_profile(pb.SecurityProfile(profile_type=SP.RuntimeDefault), "")
    p = run(runner, config(*script), "def", seccomp=profile)
    assert p.returncode == 0, p.stderr
    assert status_field(p.stdout, "Seccomp") == "2"
    assert p.stdout.splitlines()[-1] == "blocked"
    assert "Operation not permitted" in p.stderr

    unconfined = seccomp.load_profile(pb.SecurityProfile(profile_type=SP.Unconfined), "")
    p = run(runner, config(*script), "unc", seccomp=unconfined)
    assert status_field(p.stdout, "Seccomp") == "0"
    assert p.stdout.splitlines()[-1] == "unshared", p.stderr


def test_masked_paths(runner: Runner) -> None:
    cfg = config("ls /sys/firmware | wc -l")
    assert run(runner, cfg, "masked").stdout.strip() == "0"
    cfg.linux.security_context.masked_paths.append("/proc/timer_list")
    p = run(runner, cfg, "unmasked")
    assert int(p.stdout.strip()) > 0, p.stderr


def test_infra_then_container_joins_its_namespaces(runner: Runner) -> None:
    sb_root = runner.work / "infra" / "rootfs"
    sb_root.mkdir(parents=True)
    sb_cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="p", namespace="n", uid="u"), hostname="podname"
    )
    sb_id = f"pycri-test-{uuid.uuid4().hex[:12]}"
    min_oom = own_oom_score_adj()
    sb_spec = sandbox_spec(
        sb_cfg,
        SandboxContext(
            sandbox_id=sb_id, rootfs=str(sb_root), cgroup_parent=runner.cgroup_parent,
            min_oom_score_adj=min_oom, seccomp=seccomp.default_profile(),
        ),
    )  # fmt: skip
    pid = runner.start_detached(sb_spec, sb_id)
    try:
        cfg = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="t"),
            command=["/bin/sh", "-c", "hostname; cat /proc/1/cmdline; echo"],
        )
        root = runner.rootfs("member")
        cid = f"pycri-test-{uuid.uuid4().hex[:12]}"
        ctx = ContainerContext(
            container_id=cid, sandbox_id=sb_id, rootfs=str(root),
            user=resolve_user_in_rootfs(str(root), UserRequest()),
            net_ns=f"/proc/{pid}/ns/net", ipc_ns=f"/proc/{pid}/ns/ipc",
            uts_ns=f"/proc/{pid}/ns/uts", pid_ns=f"/proc/{pid}/ns/pid",
            hostname="podname", cgroup_parent=runner.cgroup_parent, min_oom_score_adj=min_oom,
        )  # fmt: skip
        p = runner.run(container_spec(cfg, sb_cfg, ImageConfig(), ctx), cid)
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        assert lines[0] == "podname"
        assert lines[1].replace("\0", " ").strip() == "/catatonit -P"
    finally:
        runner.delete(sb_id)


def test_oom_score_adj_clamped_to_ours(runner: Runner) -> None:
    cfg = config("cat /proc/self/oom_score_adj")
    cfg.linux.resources.oom_score_adj = own_oom_score_adj() - 100
    p = run(runner, cfg)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout) == max(own_oom_score_adj(), -1000)


def test_bind_mounts_and_device(runner: Runner, tmp_path: Path) -> None:
    host = tmp_path / "shared"
    host.mkdir()
    (host / "f").write_text("hello")
    cfg = config(
        "cat /ro/f; echo",
        "touch /ro/x 2>/dev/null && echo ro-writable || echo ro-refused",
        "touch /rw/x && echo rw-ok",
        "cat /dev/xnull && echo dev-ok",
    )
    cfg.mounts.add(container_path="/ro", host_path=str(host), readonly=True)
    cfg.mounts.add(container_path="/rw", host_path=str(host))
    dev = DeviceInfo("/dev/xnull", "c", 1, 3, 0o666, 0, 0, "rw")
    p = run(runner, cfg, devices=(dev,))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["hello", "ro-refused", "rw-ok", "dev-ok"]
    assert (host / "x").exists()


def test_privileged_gets_everything(runner: Runner) -> None:
    cfg = config("grep CapEff /proc/self/status", "ls /sys/firmware | wc -l")
    cfg.linux.security_context.privileged = True
    sb = sandbox()
    sb.linux.security_context.privileged = True
    root = runner.rootfs("priv")
    cid = f"pycri-test-{uuid.uuid4().hex[:12]}"
    ctx = ContainerContext(
        container_id=cid, sandbox_id="sb", rootfs=str(root),
        user=resolve_user_in_rootfs(str(root), UserRequest()), cgroup_parent=runner.cgroup_parent,
        min_oom_score_adj=own_oom_score_adj(), seccomp=seccomp.default_profile(),
        available_capabilities=own_capabilities(),
    )  # fmt: skip
    p = runner.run(container_spec(cfg, sb, ImageConfig(), ctx), cid)
    assert p.returncode == 0, p.stderr
    assert int(status_field(p.stdout, "CapEff"), 16) == cap_mask(own_capabilities())
    assert int(p.stdout.splitlines()[-1]) > 0
