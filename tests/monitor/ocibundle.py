"""Test helpers: busybox bundles, a per-test environment, cleanup of everything made."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pycri.oci.runtime import OCIRuntime

RUNTIMES = {"runc": "/usr/sbin/runc", "crun": "/usr/bin/crun"}
CGROUP_ROOT = Path("/sys/fs/cgroup")
APPLETS = ("sh", "echo", "sleep", "cat", "printf", "true", "kill")
CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"]


def crun_unusable_reason() -> str | None:
    """Why crun cannot run here (hybrid cgroups with a controller on v2), or None."""
    controllers = CGROUP_ROOT / "unified" / "cgroup.controllers"
    if controllers.exists() and controllers.read_text().strip():
        return (
            "crun 1.8 refuses hybrid cgroups while "
            f"{controllers.read_text().strip()} is bound to cgroup v2 "
            "(mount -t cgroup -o hugetlb none /sys/fs/cgroup/hugetlb to enable)"
        )
    return None


def make_rootfs(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    shutil.copy2("/usr/bin/busybox", root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    return root


def own_oom_score_adj() -> int:
    return int(Path("/proc/self/oom_score_adj").read_text())


def write_bundle(bundle: Path, rootfs: Path, args: list[str], cgroups_path: str) -> Path:
    bundle.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/bin", "GREETING=hello"],
            "cwd": "/",
            "capabilities": {k: CAPS for k in ("bounding", "effective", "permitted")},
            "noNewPrivileges": True,
            "oomScoreAdj": own_oom_score_adj(),
        },
        "root": {"path": str(rootfs), "readonly": False},
        "hostname": "t",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        ],
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
            "cgroupsPath": cgroups_path,
        },
    }  # fmt: skip
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def remove_cgroup_tree(name: str) -> None:
    """rmdir <hierarchy>/<name> (children first) in every mounted hierarchy."""
    for hierarchy in CGROUP_ROOT.iterdir():
        top = hierarchy / name
        if not top.is_dir():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def kill_if_conmon(pid: int, cid: str) -> None:
    """SIGKILL a conmon we started (checked by its command line, against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return
    if cmdline and cmdline[0].endswith(b"conmon") and cid.encode() in cmdline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Env:
    """One test's world: dirs under tmp, a runtime with its own root, a cgroup parent."""

    tmp: Path
    runtime_name: str
    rootfs: Path
    cgroup_parent: str = field(default_factory=lambda: f"pycri-test-{uuid.uuid4().hex[:10]}")
    cids: list[str] = field(default_factory=list)
    conmons: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.exit_dir = self.tmp / "exits"
        self.log_dir = self.tmp / "logs"
        for d in (self.exit_dir, self.log_dir):
            d.mkdir(parents=True)
        self.runtime = OCIRuntime(
            self.runtime_name, RUNTIMES[self.runtime_name], self.tmp / "runtime-root"
        )

    def new_id(self) -> str:
        cid = uuid.uuid4().hex
        self.cids.append(cid)
        return cid

    def bundle(self, cid: str, args: list[str]) -> Path:
        return write_bundle(
            self.tmp / "bundles" / cid, self.rootfs, args, f"/{self.cgroup_parent}/{cid}"
        )

    def persist(self, cid: str) -> Path:
        return self.tmp / "persist" / cid

    def log(self, cid: str) -> Path:
        return self.log_dir / f"{cid}.log"

    def cleanup(self) -> None:
        for cid in self.cids:
            subprocess.run(
                [self.runtime.path, "--root", str(self.runtime.root), "delete", "--force", cid],
                capture_output=True,
                check=False,
            )
            pidfile = self.persist(cid) / "conmon.pid"
            pid = self.conmons.get(cid)
            if pid is None and pidfile.exists():
                with contextlib.suppress(ValueError):
                    pid = int(pidfile.read_text())
            if pid:
                kill_if_conmon(pid, cid)
                deadline = time.monotonic() + 5
                while pid_alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.02)
        remove_cgroup_tree(self.cgroup_parent)
        shutil.rmtree(self.tmp, ignore_errors=True)
