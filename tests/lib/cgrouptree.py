"""Cgroups for the reader's tests: real ones on this host, made in every hierarchy the
readers look at, with a process charged to them from its start; and directories laid
out like a cgroup root, holding the files a test writes."""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PURE_V2 = (ROOT / "cgroup.controllers").exists()
SPIN = "while :; do :; done"  # a shell builtin loop: one process, always runnable


def write(root: Path, files: dict[str, str]) -> None:
    """Each file (a path relative to `root`) with its text, its directories made."""
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


@dataclass
class Cgroup:
    """One cgroup in every hierarchy the readers look at (v2; or v1's memory, cpuacct and
    pids plus a hybrid host's unified mount)."""

    rel: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def dirs(self) -> list[Path]:
        if PURE_V2:
            return [ROOT / self.rel]
        found = [ROOT / c / self.rel for c in ("memory", "cpuacct", "pids")]
        return found + ([ROOT / "unified" / self.rel] if (ROOT / "unified").is_dir() else [])

    def make(self, memory_limit: int) -> None:
        if PURE_V2 and (parent := (ROOT / self.rel).parent) != ROOT:
            # a child gets its parent's controllers (the parent then may hold no process)
            for c in ("+memory", "+pids", "+cpu"):
                with contextlib.suppress(OSError):  # best effort, as a kubelet's pod cgroup
                    (parent / "cgroup.subtree_control").write_text(c)
        for d in self.dirs:
            d.mkdir()
        limit = (ROOT / self.rel / "memory.max" if PURE_V2
                 else ROOT / "memory" / self.rel / "memory.limit_in_bytes")
        limit.write_text(str(memory_limit))

    def spin(self, netns: bool = False) -> int:
        """A spinning shell that joined this cgroup before exec'ing the loop, so its
        pages are charged here; with `netns`, in a network namespace of its own holding
        lo and a veth pair eth0-eth1 (gone with the process)."""
        files = [str(d / "cgroup.procs") for d in self.dirs]
        script = f'for f; do echo $$ > "$f"; done; exec sh -c "{SPIN}"'
        if netns:
            script = f"ip link add eth0 type veth peer name eth1 && {script}"
        p = subprocess.Popen([*(["unshare", "--net"] if netns else []), "sh", "-c", script,
                              "sh", *files])
        self.procs.append(p)
        deadline = time.monotonic() + 10
        while str(p.pid) not in (self.dirs[0] / "cgroup.procs").read_text().split():
            assert time.monotonic() < deadline, "the process did not join its cgroup"
            time.sleep(0.01)
        return p.pid

    def remove(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        for d in self.dirs:
            deadline = time.monotonic() + 5  # a killed task leaves the cgroup a moment later
            while d.exists():
                try:
                    d.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
