"""`pycri check`: inspect the host and say what works, what doesn't, and the fix.

Each check is a small function returning a `Check`; `run_checks` runs them all
and never raises, since the point is to report on a broken host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pycri import cgroups
from pycri.cadvisor.door import DEAD, DOOR, FREE, SERVED, answers, holder
from pycri.config import CheckpointConfig, Config
from pycri.criu.support import Probe, probe_criu, probe_runtime
from pycri.network.cache import SET_ASIDE, ResultCache
from pycri.oci import mounts, userns
from pycri.store.db import count_set_aside

NAMESPACES = ("mnt", "uts", "ipc", "pid", "net", "cgroup", "user")
MIN_FREE_BYTES = 2 * 1024**3
DEBIAN_CNI_DIR = "/usr/lib/cni"  # where containernetworking-plugins installs them


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    # Something the config runs without (checkpoint/restore, user namespaces, a handler
    # other than the default): reported as a warning, not a failure.
    optional: bool = False


def _version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unusable ({e})"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "?"


def _binary(name: str, path: str, key: str, package: str | None, default: str | None,
            optional: bool = False) -> Check:
    """An executable the config names; the fix says how to get it where `key` points."""
    if os.access(path, os.X_OK):
        return Check(name, True, f"{path}: {_version(path)}", optional=optional)
    if package is None:
        fix = f"install the runtime at {path}, or set {key}"
    elif path == default:
        fix = f"apt-get install {package}"
    else:
        fix = (f"set {key} to an installed {package} "
               f"(apt-get install {package} puts it at {default})")
    return Check(name, False, f"{path} not found", fix, optional=optional)


def _binaries(cfg: Config) -> Iterator[Check]:
    """What `pycri serve` runs: the default handler's runtime, conmon and (without a
    pause image) the infra are needed; the other handlers only by pods that ask for them."""
    defaults = Config()
    for name, h in cfg.runtimes.items():
        known = defaults.runtimes.get(name)
        yield _binary(f"runtime {name}", h.path, f"runtimes.{name}.path",
                      name if known else None, known.path if known else None,
                      optional=name != cfg.default_runtime)
    yield _binary("conmon", cfg.conmon, "conmon", "conmon", defaults.conmon)
    yield _binary("infra (catatonit)", cfg.infra_binary, "infra_binary", "catatonit",
                  defaults.infra_binary, optional=bool(cfg.pause_image))


def _cgroups(cfg: Config) -> Iterator[Check]:
    mode = cgroups.mode()
    yield Check("cgroups", True, f"mode {mode}")
    if mode != "hybrid" or "hugetlb" not in cgroups.v2_controllers():
        return
    for name, h in sorted(cfg.runtimes.items()):
        if Path(h.path).name == "crun":
            yield Check(
                f"runtime {name} on hybrid cgroups",
                False,
                "hugetlb is bound to the v2 hierarchy; crun 1.8 refuses to run containers here",
                "mkdir -p /sys/fs/cgroup/hugetlb && mount -t cgroup -o hugetlb none "
                "/sys/fs/cgroup/hugetlb (binds hugetlb to v1), or use the runc handler",
                optional=name != cfg.default_runtime,
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
            f"add {DEBIAN_CNI_DIR} to cni.bin_dirs (containernetworking-plugins put it there)"
            if Path(DEBIAN_CNI_DIR, "bridge").exists() else
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


@contextlib.contextmanager
def _existing_or_stand_in(path: Path, mode: int) -> Iterator[tuple[Path, str]]:
    """`path`, or where it does not exist yet, a fresh dir of the mode pycri would give
    it in its nearest existing parent (the filesystem `path` will be made on), removed
    afterwards; with a note saying which."""
    if path.is_dir():
        yield path, ""
        return
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    stand_in = parent / f".pycri-check-{secrets.token_hex(4)}"
    os.mkdir(stand_in, mode)
    try:
        yield stand_in, f"{path} does not exist yet: probed beside {parent}"
    finally:
        stand_in.rmdir()


def _probe_kernel(cfg: Config) -> tuple[str | None, str]:
    """The start-up probe, on the configured dirs or on stand-ins where pycri never ran."""
    with contextlib.ExitStack() as stack:
        try:
            store, note1 = stack.enter_context(_existing_or_stand_in(Path(cfg.root), 0o700))
            area, note2 = stack.enter_context(
                _existing_or_stand_in(mounts.rootfs_area(cfg.state), 0o711))
        except OSError as e:
            return f"not probed: {e}", ""
        return userns.probe_kernel(store, area), "; ".join(n for n in (note1, note2) if n)


def _user_namespaces(cfg: Config) -> Iterator[Check]:
    """What `Status` advertises as features.user_namespaces, with the reason where not.
    Optional: only pods with hostUsers: false need them."""
    kernel, note = _probe_kernel(cfg)
    for name, h in sorted(cfg.runtimes.items()):
        problem = kernel or userns.runtime_problem(_version(h.path))
        if problem:
            yield Check(f"user namespaces ({name})", False, problem,
                        "see README: user namespaces need kernel idmapped mounts under "
                        "overlayfs, runc >= 1.1 or crun >= 1.8, and a state dir others can "
                        "search (0711)", optional=True)
        else:
            yield Check(f"user namespaces ({name})", True,
                        "pods with hostUsers: false can run (idmapped layers and volumes)"
                        + (f" ({note})" if note else ""))


def _criu_fix(c: CheckpointConfig, probe: Probe) -> str:
    """What to do about CRIU on this host: installing the packaged CRIU does not help
    where the one installed is what fails."""
    until = "; checkpoint RPCs answer FailedPrecondition until then"
    if not os.access(c.criu, os.X_OK):
        return (f"apt-get install criu (or set checkpoint.criu to a CRIU that passes "
                f"`criu check` on this kernel){until}")
    if not probe.lasting:
        return f"run pycri check again on a quieter host, or raise checkpoint.check_timeout{until}"
    if probe.detail:
        return (f"the installed CRIU ({probe.detail} at {c.criu}) fails `criu check` on this "
                f"kernel (Linux {os.uname().release}): a newer CRIU is needed; build a "
                f"release that supports this kernel and set checkpoint.criu to it{until}")
    return f"set checkpoint.criu to a CRIU binary that runs on this machine{until}"


def _checkpoint(cfg: Config) -> Iterator[Check]:
    """CRIU and each handler's checkpoint support: the same probes CheckpointContainer uses."""
    c = cfg.checkpoint
    criu = asyncio.run(probe_criu(c))
    yield Check("checkpoint/restore (CRIU)", criu.problem is None, criu.problem or criu.detail,
                "" if criu.problem is None else _criu_fix(c, criu), optional=True)
    runtimes = {name: asyncio.run(probe_runtime(name, h.path, c.check_timeout))
                for name, h in cfg.runtimes.items()
                if os.access(h.path, os.X_OK)}  # a missing one has its own runtime check
    able = [name for name, rt in runtimes.items() if rt.problem is None]
    for name, rt in runtimes.items():
        fix = "" if rt.problem is None else (
            f"point runtimes.{name}.path at a {Path(cfg.runtimes[name].path).name} built "
            "with CRIU" + (f", or checkpoint pods of handler {', '.join(able)}" if able else ""))
        yield Check(f"checkpoint with {name}", rt.problem is None, rt.problem or rt.detail,
                    fix, optional=True)


def _set_aside(cfg: Config) -> Check:
    """Stored state pycri could not use and kept for a person: database rows (readable
    here only while no daemon holds the database), pods' CNI caches, and damaged
    databases moved aside (their records were rebuilt from the node)."""
    name = "records set aside"
    found: list[str] = []
    cache = ResultCache(Path(cfg.root) / "cni-cache")
    if n := cache.set_aside_count():
        found.append(f"{n} pod CNI cache{'s' * (n > 1)} in {cache.root / SET_ASIDE}")
    db, held = cfg.db_path, ""
    damaged = sorted(p.name for p in db.parent.glob(f"{db.name}.damaged-*")
                     if not p.name.endswith(("-wal", "-shm"))) if db.parent.is_dir() else []
    if damaged:  # moved aside at a start, and the records rebuilt from the node
        found.append(f"{len(damaged)} damaged database{'s' * (len(damaged) > 1)} in "
                     f"{db.parent} ({', '.join(damaged)})")
    if db.exists():
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0)
            try:
                found += [f"{n} {kind} row{'s' * (n > 1)}"
                          for kind, n in count_set_aside(conn).items()]
            finally:
                conn.close()
        except sqlite3.Error:
            held = (f"; the database {db} cannot be read now (a running daemon holds "
                    "it): pycri_records_set_aside on /metrics counts its rows")
    if not found:
        return Check(name, True, f"none{held}")
    return Check(name, False, ", ".join(found) + held,
                 "read them (never their contents into a ticket: they may hold Secrets), "
                 "then delete them; docs/operating.md, \"Records set aside\"", optional=True)


def _cadvisor(cfg: Config) -> Check:
    """Whether the kubelet's built-in cAdvisor will name pycri's containers: it asks a
    containerd API on --containerd (default /run/containerd/containerd.sock) at its start,
    and pycri's door answers there only if pycri's link holds that path."""
    name = "kubelet's cAdvisor (/metrics/cadvisor, /stats/summary)"
    door, default = cfg.cadvisor_socket, cfg.cadvisor.default_path
    flag = f"start the kubelet with --containerd={door}"
    if not cfg.cadvisor.enable:
        return Check(name, False, "cadvisor.enable = false: the kubelet will not name pycri's "
                     "containers (no container, pod, namespace or image label)",
                     "set [cadvisor] enable = true", optional=True)
    serving = f"door {door} " + ("answers" if answers(door) else "opens when pycri starts")
    if not default:
        return Check(name, True, f"{serving}; cadvisor.default_path is empty: {flag}")
    path = Path(default)
    held = holder(path, door)
    if held == FREE:
        return Check(name, True, f"{serving}; {path} is free: pycri links it at start")
    if held == DOOR:
        return Check(name, True, f"{serving}; {path} leads to it")
    if held == SERVED:
        return Check(name, False, f"{serving}; {path} is served by another process (a "
                     "containerd?): a kubelet with default flags sees its containers, not "
                     "pycri's", flag, optional=True)
    if held == DEAD:
        return Check(name, True, f"{serving}; {path} is a dead socket: pycri takes it at start")
    return Check(name, False, f"{serving}; {path} is not a socket, and pycri leaves it be",
                 f"remove {path}, or {flag}", optional=True)


def run_checks(cfg: Config) -> list[Check]:
    """Every check, in order; a Check not `optional` that fails is one the config needs."""
    producers: list[Callable[[], Check | Iterator[Check]]] = [
        lambda: _binaries(cfg),
        lambda: _cgroups(cfg),
        _overlay,
        _namespaces,
        lambda: _cni(cfg),
        lambda: _package_data(cfg),
        lambda: _disk(cfg),
        lambda: _user_namespaces(cfg),
        lambda: _checkpoint(cfg),
        lambda: _cadvisor(cfg),
        lambda: _set_aside(cfg),
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
