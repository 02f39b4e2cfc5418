"""A pod's own user namespace: made with the pod's network namespace, pinned, probed.

The namespace is created by a short-lived `unshare --user --net` helper whose maps
pycri writes, then pinned (a bind of its nsfs file) next to the pod's other state,
like the network namespace made with it. Created together, the network namespace is
owned by the pod's user namespace: container root can then mount sysfs and set the
pod's net.* sysctls, and CNI plugins (host root) still configure it. The infra and
every container join both by path; the pinned user namespace is also what the
idmapped mounts of the pod's rootfs layers and volumes are made with.

A thread of the daemon cannot do this itself: a multithreaded process may not enter
or create a user namespace.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pycri.errors import PycriError
from pycri.network.netns import pin_netns_of
from pycri.oci import mounts
from pycri.oci.spec.namespaces import IDMap
from pycri.procs import communicate, kill_and_reap

UNSHARE = "unshare"  # util-linux
# The helper reports that it is in its namespaces, then waits until it is killed.
_HELPER = ("--user", "--net", "sh", "-c", "echo; read _")
HELPER_TIMEOUT = 10.0
_MS_BIND = 4096
_libc = ctypes.CDLL(None, use_errno=True)

# Oldest versions checked here: runc 1.1 opens bind sources before entering the user
# namespace (so 0700 host directories still bind), crun 1.8.1 was run the same way.
MIN_RUNTIME_VERSION = {"runc": (1, 1), "crun": (1, 8)}
_VERSION = re.compile(r"^(runc|crun) version (\d+)\.(\d+)", re.MULTILINE)


def _map_text(maps: Sequence[IDMap]) -> str:
    return "".join(f"{m.container_id} {m.host_id} {m.length}\n" for m in maps)


def _map_and_pin(pid: int, uids: Sequence[IDMap], gids: Sequence[IDMap], pin: Path) -> None:
    """Write the helper's maps (root of the parent namespace may write any) and pin it."""
    with open(f"/proc/{pid}/uid_map", "w") as f:
        f.write(_map_text(uids))
    with open(f"/proc/{pid}/gid_map", "w") as f:
        f.write(_map_text(gids))
    os.close(os.open(pin, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    if _libc.mount(f"/proc/{pid}/ns/user".encode(), os.fsencode(pin), None, _MS_BIND, None):
        err = ctypes.get_errno()
        raise OSError(err, f"pin user namespace on {pin}: {os.strerror(err)}")


async def create_pod_namespaces(
    userns_pin: Path, netns_name: str, uids: Sequence[IDMap], gids: Sequence[IDMap]
) -> Path:
    """A new user namespace with these maps, pinned at `userns_pin`, and a network
    namespace it owns, pinned as /run/netns/<netns_name> (returned). The caller undoes
    both pins (`unpin_userns`, `remove_netns`) on failure."""
    proc = await asyncio.create_subprocess_exec(
        UNSHARE, *_HELPER, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        ready = await asyncio.wait_for(proc.stdout.readline(), HELPER_TIMEOUT)
        if not ready:
            err = await asyncio.wait_for(proc.stderr.read(), HELPER_TIMEOUT)
            raise PycriError(f"{UNSHARE} --user --net failed: "
                             f"{err.decode(errors='replace').strip()}")
        await asyncio.to_thread(_map_and_pin, proc.pid, uids, gids, userns_pin)
        return await pin_netns_of(proc.pid, netns_name)
    finally:
        await kill_and_reap(proc)


def unpin_userns(pin: Path) -> None:
    """Drop the pin (the namespace lives on while a process is in it); absent is fine."""
    mounts.unstage(pin)


def open_userns(pin: Path) -> int:
    """An fd of the pinned namespace, for mount_setattr(MOUNT_ATTR_IDMAP)."""
    return os.open(pin, os.O_RDONLY | os.O_CLOEXEC)


# -- what this host can do ---------------------------------------------------------------


@dataclass(frozen=True)
class Support:
    """Whether user-namespaced pods can run, by runtime handler; the reason where not."""

    kernel_problem: str | None
    runtime_problems: Mapping[str, str | None]  # handler name -> problem

    def problem(self, handler: str) -> str | None:
        return self.kernel_problem or self.runtime_problems.get(handler, "unknown handler")


def _traversable(path: Path) -> str | None:
    """The OCI runtime reaches a user-namespaced container's rootfs as the pod's root,
    an unprivileged host user: every directory above the staging area must let others
    search it."""
    for p in [path, *path.parents]:
        mode = p.stat().st_mode
        if not mode & stat.S_IXOTH:
            return (f"{p} (mode {stat.S_IMODE(mode):04o}) is not searchable by other users; "
                    "a user-namespaced pod's root cannot reach its rootfs under it")
    return None


def _probe_idmapped_overlay(store: Path, scratch: Path) -> None:
    """Mount an overlay whose lower layer is an idmapped mount of the image store, as every
    user-namespaced rootfs is; raises OSError naming the step the kernel refused."""
    helper = subprocess.Popen([UNSHARE, *_HELPER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        assert helper.stdout is not None
        if not helper.stdout.readline():
            raise OSError(f"{UNSHARE} --user --net could not run")
        maps = (IDMap(0, 1 << 20, 65536),)
        _map_and_pin(helper.pid, maps, maps, scratch / "userns")
    finally:
        helper.kill()
        helper.wait()
    fd = open_userns(scratch / "userns")
    try:
        mounts.stage_idmapped(str(store), scratch / "lower", fd, readonly=True, recursive=False)
    finally:
        os.close(fd)
    for d in ("upper", "work", "merged"):
        (scratch / d).mkdir()
    opts = f"lowerdir={scratch / 'lower'},upperdir={scratch / 'upper'},workdir={scratch / 'work'}"
    if _libc.mount(b"overlay", os.fsencode(scratch / "merged"), b"overlay", 0, opts.encode()):
        err = ctypes.get_errno()
        raise OSError(err, f"overlay over an idmapped layer: {os.strerror(err)}")


def _clear_probe(scratch: Path) -> None:
    """Unmount the probe's mounts first; only then delete its upper and work dirs (never
    mount points), so nothing can reach through a mount into the image store."""
    if not scratch.is_dir():
        return
    for name in ("merged", "lower", "userns"):
        mounts.unstage(scratch / name)
    for name in ("upper", "work"):
        shutil.rmtree(scratch / name, ignore_errors=True)
    scratch.rmdir()


def probe_kernel(store: Path, rootfs_area: Path) -> str | None:
    """None if this host can run user-namespaced pods with pycri's staging; else why not."""
    if not Path("/proc/self/ns/user").exists():
        return "the kernel has no user namespaces"
    if shutil.which(UNSHARE) is None:
        return f"{UNSHARE} (util-linux) is not installed"
    if problem := _traversable(rootfs_area):
        return problem
    scratch = rootfs_area / ".probe-userns"
    problem = None
    try:
        _clear_probe(scratch)  # a crash's leftover
        mounts.private_dirs(scratch)
        _probe_idmapped_overlay(store, scratch)
    except OSError as e:
        problem = f"idmapped mounts of {store} under overlayfs do not work here: {e}"
    try:
        _clear_probe(scratch)
    except OSError as e:
        problem = problem or f"the probe's mounts in {scratch} could not be removed: {e}"
    return problem


def runtime_problem(version_output: str) -> str | None:
    """From `<runtime> --version`: None for a runtime known to run such pods."""
    m = _VERSION.search(version_output)
    if m is None:
        first = version_output.strip().splitlines()[0] if version_output.strip() else "nothing"
        return f"not a runtime known to support user namespaces (--version said {first!r})"
    name, version = m.group(1), (int(m.group(2)), int(m.group(3)))
    least = MIN_RUNTIME_VERSION[name]
    if version < least:
        return f"{name} {version[0]}.{version[1]} is older than {least[0]}.{least[1]}"
    return None


async def _runtime_problem_of(path: str) -> str | None:
    try:
        proc = await asyncio.create_subprocess_exec(
            path, "--version", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        out, _ = await communicate(proc, None, HELPER_TIMEOUT)
    except (OSError, TimeoutError) as e:
        return f"{path} --version failed: {e}"
    return runtime_problem(out.decode(errors="replace"))


async def probe(
    runtimes: Mapping[str, str], default: str, store: Path, rootfs_area: Path
) -> Support:
    """Once, at start: the kernel (idmapped layers under overlayfs, a searchable rootfs
    area) and each handler's runtime (name -> binary; "" is `default`)."""
    kernel = await asyncio.to_thread(probe_kernel, store, rootfs_area)
    names = sorted(runtimes)
    found = await asyncio.gather(*(_runtime_problem_of(runtimes[n]) for n in names))
    problems = dict(zip(names, found, strict=True))
    problems[""] = problems.get(default, "unknown handler")
    return Support(kernel, problems)
