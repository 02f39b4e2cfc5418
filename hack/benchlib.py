"""What the benchmarks that start their own private pycri daemons share (bench-nri.py,
bench-stats.py): quantiles, a daemon on its own root, socket and CNI bridge, and its
complete removal. Not a test; imports the test suite's helpers."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from pycri.api import api_pb2 as pb
from tests.conftest import CRIClient, PycriProcess
from tests.e2e.conftest import _scrub, conflist

TIMEOUT = 120.0


def quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks; nan when empty."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs: list[float]) -> float:
    return quantile(xs, 0.5)


def private_daemon(tmp: Path, bridge: str, subnet: str, extra_config: str,
                   tree: Path | None = None) -> PycriProcess:
    """A not yet started `pycri serve` under `tmp` (made here) on its own CNI bridge, from
    `tree` (default: the interpreter's path). Run it from a directory holding no
    `pycri`: `python -m` puts its cwd before PYTHONPATH."""
    tmp.mkdir()
    net_d = tmp / "net.d"
    net_d.mkdir()
    (net_d / "10-bench.conflist").write_text(conflist(bridge, subnet, tmp / "ipam", []))
    config = tmp / "pycri.toml"
    # cAdvisor's default path is the host's: a private daemon of this build never links
    # it (an older build, `tree`, has no such key).
    config.write_text(
        ('[cadvisor]\ndefault_path = ""\n' if tree is None else "")
        + f'[cni]\nconf_dir = "{net_d}"\ndefault_network = false\n'
        f'[images]\nregistries_conf = "{tmp / "registries.conf"}"\n'
        f'registries_conf_dir = "{tmp / "registries.conf.d"}"\n' + extra_config)
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    return PycriProcess(root=tmp / "root", state=tmp / "state", socket=tmp / "state" / "cri.sock",
                        config=config, log=tmp / "pycri.log", env=env)


def start(proc: PycriProcess, image: str) -> CRIClient:
    """Start the daemon and pull `image` into it."""
    proc.start()
    cri = proc.client()
    cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=image)), timeout=TIMEOUT)
    return cri


def sleep_pod(cri: CRIClient, cfg: pb.PodSandboxConfig, image: str) -> tuple[str, str]:
    """RunPodSandbox with `cfg`, then a `sleep 3600` container of `image` created and
    started in it: (pod ID, container ID)."""
    rt = cri.runtime
    sid = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=TIMEOUT).pod_sandbox_id
    cid = rt.CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=sid, sandbox_config=cfg, config=pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="sleep"), image=pb.ImageSpec(image=image),
            command=["sleep", "3600"], log_path="sleep.log")), timeout=TIMEOUT).container_id
    rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=TIMEOUT)
    return sid, cid


def tear_down(cri: CRIClient | None, proc: PycriProcess, tmp: Path, bridge: str) -> None:
    """Stop and remove every pod, stop the daemon (by its pid), then remove what a failure
    may have left: monitors, mounts, netns, the bridge."""
    if cri is not None:
        with contextlib.suppress(Exception):
            for sb in cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items:
                cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sb.id))
                cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sb.id))
        cri.channel.close()
    if proc.proc is not None:
        proc.stop()
    _scrub(tmp)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)
