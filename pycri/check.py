"""`pycri check`: inspect the host and say what works, what doesn't, and the fix.

Each check is a small function returning a `Check`; `run_checks` runs them all
and never raises, since the point is to report on a broken host.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pycri.checkpoint.support import probe_criu, probe_runtime
from pycri.config import Config
from pycri.oci import mounts, userns

CGROUP_ROOT = Path("/sys/fs/cgroup")
NAMESPACES = ("mnt", "uts", "ipc", "pid", "net", "cgroup", "user")
MIN_FREE_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    # A feature the node runs without (checkpoint/restore): reported, but not a failure.
    optional: bool = False


def _version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unusable ({e})"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "?"


def _binary(name: str, path: str, package: str) -> Check:
    if not os.access(path, os.X_OK):
        return Check(name, False, f"{path} not found", f"apt-get install {package}")
    return Check(name, True, f"{path}: {_version(path)}")


def cgroup_mode(root: Path = CGROUP_ROOT) -> str:
    """'v2' (unified), 'hybrid' (v1 controllers + a v2 mount) or 'v1'."""
    if (root / "cgroup.controllers").exists():
        return "v2"
    if (root / "unified" / "cgroup.controllers").exists():
        return "hybrid"
    return "v1"


def v2_controllers(root: Path = CGROUP_ROOT) -> list[str]:
    """Controllers bound to the v2 hierarchy (on a hybrid host, the 'unified' mount)."""
    for f in (root / "cgroup.controllers", root / "unified" / "cgroup.controllers"):
        if f.exists():
            return f.read_text().split()
    return []


def _cgroups() -> Iterator[Check]:
    mode = cgroup_mode()
    yield Check("cgroups", True, f"mode {mode}")
    if mode == "hybrid" and "hugetlb" in v2_controllers():
        yield Check(
            "crun on hybrid cgroups",
            False,
            "hugetlb is bound to the v2 hierarchy; crun 1.8 refuses to run containers here",
            "mkdir -p /sys/fs/cgroup/hugetlb && mount -t cgroup -o hugetlb none "
            "/sys/fs/cgroup/hugetlb (binds hugetlb to v1), or use the runc handler",
        )


def _overlay() -> Check:
    fs = Path("/proc/filesystems").read_text()
    if "overlay" in fs.split():
        return Check("overlayfs", True, "supported by the kernel")
    return Check("overlayfs", False, "not in /proc/filesystems", "modprobe overlay")


def _namespaces() -> Check:
    missing = [ns for ns in NAMESPACES if not Path(f"/proc/self/ns/{ns}").exists()]
    if missing:
        return Check(
            "namespaces",
            False,
            f"missing: {', '.join(missing)}",
            "use a kernel built with these namespaces",
        )
    return Check("namespaces", True, ", ".join(NAMESPACES))


def _cni(cfg: Config) -> Iterator[Check]:
    bins = [d for d in cfg.cni.bin_dirs if Path(d, "bridge").exists()]
    if bins:
        yield Check("CNI plugins", True, f"found in {', '.join(bins)}")
    else:
        yield Check(
            "CNI plugins",
            False,
            f"no 'bridge' plugin in {', '.join(cfg.cni.bin_dirs)}",
            "apt-get install containernetworking-plugins",
        )
    conf = Path(cfg.cni.conf_dir)
    confs = sorted(p.name for p in conf.glob("*") if p.suffix in (".conf", ".conflist", ".json"))
    if confs:
        yield Check("CNI config", True, f"{conf}: {', '.join(confs)}")
    elif cfg.cni.default_network:
        yield Check(
            "CNI config",
            True,
            f"{conf} is empty; the built-in default network ({cfg.cni.default_subnet}) "
            "will be used",
        )
    else:
        yield Check(
            "CNI config",
            False,
            f"{conf} holds no network config",
            f"write a .conflist into {conf} or set cni.default_network = true",
        )


def _package_data(cfg: Config) -> Check:
    """The files shipped in pycri/data parse: a wheel missing them would fail every pod."""
    from pycri.network.conf import DEFAULT_TEMPLATE, default_network
    from pycri.oci.seccomp import DEFAULT_PROFILE_PATH, default_profile

    try:
        default_profile()
        default_network(DEFAULT_TEMPLATE, cfg.cni.default_subnet, cfg.cni.default_bridge)
    except Exception as e:
        return Check("package data", False, str(e), "reinstall pycri (pip install pycri-*.whl)")
    return Check("package data", True, f"{DEFAULT_PROFILE_PATH.parent}")


def _disk(cfg: Config) -> Check:
    path = Path(cfg.root)
    while not path.exists():
        path = path.parent
    free = shutil.disk_usage(path).free
    detail = f"{free / 1024**3:.1f} GiB free under {path}"
    if free < MIN_FREE_BYTES:
        return Check("disk", False, detail, f"free space under {cfg.root}")
    return Check("disk", True, detail)


def _user_namespaces(cfg: Config) -> Iterator[Check]:
    """What `Status` advertises as features.user_namespaces, with the reason where not."""
    area, store = mounts.rootfs_area(cfg.state), Path(cfg.root)
    if area.is_dir() and store.is_dir():
        kernel = userns.probe_kernel(store, area)
    else:
        kernel = f"not probed: {area} or {store} does not exist yet (start pycri once)"
    for name, h in sorted(cfg.runtimes.items()):
        problem = kernel or userns.runtime_problem(_version(h.path))
        if problem:
            yield Check(f"user namespaces ({name})", False, problem,
                        "see README: user namespaces need kernel idmapped mounts under "
                        "overlayfs, runc >= 1.1 or crun >= 1.8, and a state dir others can "
                        "search (0711)")
        else:
            yield Check(f"user namespaces ({name})", True,
                        "pods with hostUsers: false can run (idmapped layers and volumes)")


def _checkpoint(cfg: Config) -> Iterator[Check]:
    """CRIU and each handler's checkpoint support: the same probes CheckpointContainer uses."""
    c = cfg.checkpoint
    criu = asyncio.run(probe_criu(c))
    yield Check("checkpoint/restore (CRIU)", criu.problem is None, criu.problem or criu.detail,
                "" if criu.problem is None else
                "install a CRIU that supports this kernel (apt-get install criu), or set "
                "checkpoint.criu; checkpoint RPCs answer FailedPrecondition until then",
                optional=True)
    for name, h in cfg.runtimes.items():
        if not os.access(h.path, os.X_OK):
            continue  # reported by its own runtime check
        rt = asyncio.run(probe_runtime(name, h.path, c.check_timeout))
        yield Check(f"checkpoint with {name}", rt.problem is None, rt.problem or rt.detail,
                    "" if rt.problem is None else f"use a {name} built with CRIU support",
                    optional=True)


def run_checks(cfg: Config) -> list[Check]:
    producers: list[Callable[[], Check | Iterator[Check]]] = [
        *(
            (lambda n=name, h=h: _binary(f"runtime {n}", h.path, n))
            for name, h in cfg.runtimes.items()
        ),
        lambda: _binary("conmon", cfg.conmon, "conmon"),
        lambda: _binary("infra (catatonit)", cfg.infra_binary, "catatonit"),
        _cgroups,
        _overlay,
        _namespaces,
        lambda: _cni(cfg),
        lambda: _package_data(cfg),
        lambda: _disk(cfg),
        lambda: _user_namespaces(cfg),
        lambda: _checkpoint(cfg),
    ]
    results: list[Check] = []
    for produce in producers:
        try:
            out = produce()
        except Exception as e:  # a broken host must still get a full report
            results.append(Check(getattr(produce, "__name__", "check"), False, f"error: {e}"))
            continue
        results.extend([out] if isinstance(out, Check) else list(out))
    return results
