"""End-to-end fixtures: a real registry with the busybox test image, and a real pycri
node with its own CNI network (unique bridge and subnet), cleaned up even on failure."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from pycri.config import CheckpointConfig
from tests.conftest import NO_DEFAULT_CADVISOR, CRIClient, PycriProcess
from tests.lib import images, tools
from tests.lib.registry import Registry

TAG = secrets.token_hex(2)
# The criu binary the nodes use (tests/lib/tools.py: PYCRI_TEST_CRIU, else `criu` on
# PATH, else the config's default): checkpoint tests run where its `criu check` passes
# and say why they are skipped elsewhere.
CRIU = tools.find("criu") or CheckpointConfig().criu
RECHECK_TIMEOUT = 60.0  # s for a restarted daemon's recheck (a few records in tests)
_n = count(1)
_octet = secrets.randbelow(200)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = Registry(tmp_path_factory.mktemp("e2e-registry"))
    reg.start()
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def busybox(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The standard busybox test image (applets, users 1000/1001, group extra=2000)."""
    return images.push_busybox(registry.addr, tmp_path_factory.mktemp("e2e-layout"))


@dataclass
class Node:
    """A running pycri with its own network; `cri` is a connected client."""

    proc: PycriProcess
    cri: CRIClient
    image: str
    tmp: Path
    bridge: str
    subnet: str

    @property
    def log_dir(self) -> Path:
        return self.tmp / "pod-logs"

    @property
    def nri_socket(self) -> str:
        """Where NRI plugins connect to this node (enabled, with no plugin, by default)."""
        return str(self.tmp / "nri" / "nri.sock")

    def restart(self, sig: int = signal.SIGTERM, *, rechecked: bool = True) -> None:
        """Stop the daemon with `sig` and start it again (see `start`)."""
        self.cri.channel.close()
        if sig == signal.SIGKILL:
            self.proc.kill()
        else:
            assert self.proc.stop(sig) == 0
        self.start(rechecked=rechecked)

    def start(self, *, rechecked: bool = True) -> None:
        """Start the stopped daemon and connect. A restarted pycri serves from its records
        first and rechecks them after (pycri/recovery.py): unless `rechecked` is False
        this waits for that recheck, so the states a test reads next are the real ones."""
        self.proc.start()
        self.cri = self.proc.client()
        if rechecked:
            deadline = time.monotonic() + RECHECK_TIMEOUT
            while self.recovery()["doneAt"] == 0:
                assert time.monotonic() < deadline, f"no recheck in {RECHECK_TIMEOUT} s"
                time.sleep(0.02)

    def stored(self) -> list[tuple[str, str]]:
        """The store's rows (kind, id). pycri holds its database exclusively, so it is
        read while the daemon is stopped; the daemon is started again after."""
        self.cri.channel.close()
        assert self.proc.stop() == 0
        try:
            db = sqlite3.connect(self.tmp / "root" / "pycri.db")
            try:
                return sorted(db.execute("SELECT kind, id FROM records").fetchall())
            finally:
                db.close()
        finally:
            self.start()

    def recovery(self) -> dict[str, int]:
        """How far the recheck got: {"pending": records not rechecked, "doneAt": ns or 0}."""
        info = self.cri.runtime.Status(pb.StatusRequest(verbose=True)).info
        recovery: dict[str, int] = json.loads(info["recovery"])
        return recovery

    def pod_config(self, name: str, **kw: object) -> pb.PodSandboxConfig:
        cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace="e2e", uid=f"uid-{name}"),
            log_directory=str(self.log_dir / name),
            **kw,  # type: ignore[arg-type]
        )
        return cfg

    def add_runtime(self, name: str, script: str) -> Path:
        """A runtime handler `name` whose binary is the shell `script` (usually a wrapper
        that slows or probes runc); the daemon is restarted to load it."""
        path = self.tmp / f"{name}-runtime"
        path.write_text(script)
        path.chmod(0o755)
        with open(self.proc.config, "a") as f:
            f.write(f'[runtimes.{name}]\npath = "{path}"\n')
        self.restart()
        return path

    def run_pod(self, name: str, **kw: object) -> tuple[str, pb.PodSandboxConfig]:
        cfg = self.pod_config(name, **kw)
        sid = self.cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg)).pod_sandbox_id
        return sid, cfg

    def container_config(
        self, name: str, command: list[str], **kw: object
    ) -> pb.ContainerConfig:
        return pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name),
            image=pb.ImageSpec(image=self.image),
            command=command,
            log_path=f"{name}.log",
            **kw,  # type: ignore[arg-type]
        )

    def create(
        self, sid: str, pod: pb.PodSandboxConfig, name: str, command: list[str], **kw: object
    ) -> str:
        cfg = self.container_config(name, command, **kw)
        return self.cri.runtime.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=sid, config=cfg, sandbox_config=pod)
        ).container_id

    def run(
        self, sid: str, pod: pb.PodSandboxConfig, name: str, command: list[str], **kw: object
    ) -> str:
        cid = self.create(sid, pod, name, command, **kw)
        self.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=cid))
        return cid

    def status(self, cid: str) -> pb.ContainerStatus:
        return self.cri.runtime.ContainerStatus(
            pb.ContainerStatusRequest(container_id=cid)
        ).status

    def pod_status(self, sid: str) -> pb.PodSandboxStatus:
        return self.cri.runtime.PodSandboxStatus(
            pb.PodSandboxStatusRequest(pod_sandbox_id=sid)
        ).status

    def exec(self, cid: str, *cmd: str, timeout: int = 10) -> pb.ExecSyncResponse:
        return self.cri.runtime.ExecSync(
            pb.ExecSyncRequest(container_id=cid, cmd=list(cmd), timeout=timeout)
        )

    def wait_for_file(self, cid: str, path: str, timeout: float = 15) -> None:
        """Wait until `path` exists in the container: the mark its command leaves once
        it is ready (say, after installing a signal trap)."""
        deadline = time.monotonic() + timeout
        while self.exec(cid, "test", "-e", path).exit_code != 0:
            assert time.monotonic() < deadline, f"{path} never appeared in {cid}"
            time.sleep(0.05)

    def remove_all(self) -> None:
        for sb in self.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items:
            self.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sb.id))
            self.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sb.id))


def conflist(bridge: str, subnet: str, ipam_dir: Path, extra: list[dict[str, object]]) -> str:
    return json.dumps({
        "cniVersion": "1.0.0",
        "name": f"e2e-{bridge}",
        "plugins": [
            {
                "type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": True,
                "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(ipam_dir)},
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
            *extra,
        ],
    })


def leftovers(tmp: Path, ids: set[str]) -> dict[str, list[str]]:
    """What a node under `tmp` may have left on the host."""
    netns = [n for n in os.listdir("/run/netns") if n.removeprefix("pycri-") in ids] if (
        os.path.isdir("/run/netns")) else []
    with open("/proc/mounts") as f:  # a mount on the root itself is a test's own
        mounts = [m for line in f if str(tmp) in (m := line.split()[1])
                  and m != str(tmp / "root")]
    procs = subprocess.run(["pgrep", "-f", f"conmon.*{tmp}"], capture_output=True,
                           text=True).stdout.split()
    cgroups = [str(d) for i in ids for pattern in (f"*/pycri/{i}", f"*/pycri/pod-{i}")
               for d in Path("/sys/fs/cgroup").glob(pattern)]
    return {"netns": netns, "mounts": mounts, "conmon": procs, "cgroups": cgroups}


def _scrub(tmp: Path) -> None:
    """Last resort after a failed test: kill monitors by pid, unmount, drop netns."""
    for pidfile in tmp.glob("state/bundles/*/monitor/conmon.pid"):
        with contextlib.suppress(Exception):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    for pidfile in tmp.glob("state/bundles/*/monitor/pidfile"):
        with contextlib.suppress(Exception):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    for runtime in ("runc", "crun"):
        for d in tmp.glob(f"state/{runtime}/*"):
            subprocess.run([runtime, "--root", str(tmp / "state" / runtime), "delete", "--force",
                            d.name], capture_output=True)
    with open("/proc/mounts") as f:
        mounts = [line.split()[1] for line in f if str(tmp) in line.split()[1]]
    for m in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True)
    for sb in tmp.glob("root/sandboxes/*"):
        ns = Path("/run/netns") / f"pycri-{sb.name}"
        if ns.exists():
            subprocess.run(["umount", "-l", str(ns)], capture_output=True)
            ns.unlink(missing_ok=True)


@pytest.fixture
def node(tmp_path: Path, busybox: str) -> Iterator[Node]:
    """A pycri daemon on its own CNI network; everything it made is removed afterwards."""
    with running_node(tmp_path, busybox) as n:
        yield n


@contextlib.contextmanager
def running_node(tmp_path: Path, busybox: str,
                 proc_type: type[PycriProcess] = PycriProcess) -> Iterator[Node]:
    """The `node` fixture's daemon, started as `proc_type` (say, an installed pycri)."""
    n = next(_n)
    bridge = f"pce{TAG}{n}"[:15]
    subnet = f"10.198.{(_octet + n) % 250}.0/24"
    net_d = tmp_path / "net.d"
    net_d.mkdir()
    (net_d / "10-e2e.conflist").write_text(conflist(bridge, subnet, tmp_path / "ipam", []))
    config = tmp_path / "pycri.toml"
    config.write_text(
        f'{NO_DEFAULT_CADVISOR}[cni]\nconf_dir = "{net_d}"\ndefault_network = false\n'
        f'[images]\nregistries_conf = "{tmp_path / "registries.conf"}"\n'
        f'registries_conf_dir = "{tmp_path / "registries.conf.d"}"\n'
        f'[nri]\nsocket_path = "{tmp_path / "nri" / "nri.sock"}"\n'
        f'plugin_path = "{tmp_path / "nri-plugins"}"\n'
        f'plugin_config_path = "{tmp_path / "nri-conf.d"}"\n'
        f'[checkpoint]\ncriu = "{CRIU}"\narchive_dirs = ["{tmp_path / "archives"}"]\n'
        'check_timeout = 120\n'
    )
    (tmp_path / "archives").mkdir()
    proc = proc_type(root=tmp_path / "root", state=tmp_path / "state",
                     socket=tmp_path / "state" / "pycri.sock", config=config,
                     log=tmp_path / "pycri.log")
    proc.start()
    node = Node(proc=proc, cri=proc.client(), image=busybox, tmp=tmp_path, bridge=bridge,
                subnet=subnet)
    try:
        node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=busybox)))
        yield node
        ids = {p.name for p in (tmp_path / "root" / "sandboxes").glob("*")}
        ids |= {c.id for c in node.cri.runtime.ListContainers(
            pb.ListContainersRequest()).containers}
        node.remove_all()
        left = leftovers(tmp_path, ids)
        nat = [r for r in subprocess.run(["iptables-save", "-t", "nat"], capture_output=True,
                                         text=True).stdout.splitlines() if f"e2e-{bridge}" in r]
        assert left == {"netns": [], "mounts": [], "conmon": [], "cgroups": []}, left
        assert nat == [], nat
    finally:
        with contextlib.suppress(grpc.RpcError, ValueError):
            node.remove_all()
        node.cri.channel.close()
        status = proc.stop()
        _scrub(tmp_path)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        assert status == 0, proc.log_text()[-3000:]
