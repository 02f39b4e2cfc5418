"""A damaged database's records, made again from the node (issue 38).

The store moves a database it cannot read aside and starts a new one (store/db.py);
before anything loads, this makes the records of what is still on the node, so the
pods and containers that run keep running, are listed, and can be stopped and removed:
- each bundle's `record.json` (store/beside.py: the record as it was when the process
  was created) gives the object's request, handler, image and log path;
- conmon's pid files give its processes, named by pid and start time only while their
  conmon still watches them;
- the CNI cache gives a pod's addresses, and says whether its network is still up;
- the content store and the unpacked layers give the images (image/found.py), and the
  bundles' records the snapshots that hold them.
The states are then learnt as after any restart (pycri/recovery.py): exit files,
processes, and the runtime where those say nothing. docs/architecture.md lists what
cannot be rebuilt.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pycri.api import api_pb2 as pb
from pycri.criu.archive import CHECKPOINT_DIR
from pycri.errors import PycriError
from pycri.image.manager import ImageManager
from pycri.launcher import Launcher
from pycri.monitor import conmon
from pycri.monitor.probe import identity_of
from pycri.network import CNIManager, remove_netns
from pycri.network.netns import NETNS_RUN_DIR
from pycri.oci import userns
from pycri.sandbox import podfiles
from pycri.store import Store, beside
from pycri.store.container import KIND as CONTAINER
from pycri.store.container import Container
from pycri.store.identity import Identity
from pycri.store.sandbox import KIND as SANDBOX
from pycri.store.sandbox import Sandbox

log = logging.getLogger(__name__)


@dataclass
class Rebuilt:
    """What a rebuild found, for its log line (and tests)."""

    pods: set[str] = field(default_factory=set)
    containers: int = 0
    images: int = 0


async def rebuild(store: Store, launcher: Launcher, images: ImageManager,
                  cni: CNIManager) -> Rebuilt:
    """Write the records of every bundle on the node, and of the images and snapshots
    they hold, into the (new) store; remove what pods with no bundle left; then say
    the rebuild is done. Idempotent: a crash during it leaves the store's mark, and
    the next start does it again."""
    out = await asyncio.to_thread(_records, store, launcher, images, cni)
    await _sweep_unrecorded(Path(launcher.cfg.root), Path(launcher.cfg.state), out.pods)
    log.warning("rebuilt the records of %d pods, %d containers and %d images from the node "
                "(the damaged database is %s)", len(out.pods), out.containers, out.images,
                store.damaged)
    store.rebuilt()
    return out


def _records(store: Store, launcher: Launcher, images: ImageManager,
             cni: CNIManager) -> Rebuilt:
    out = Rebuilt()
    snapshots: dict[str, beside.Snapshot] = {}
    refs: list[str] = []
    bundles = sorted(launcher.bundles.iterdir()) if launcher.bundles.is_dir() else []
    for bundle in bundles:
        try:
            found = beside.read(bundle)
            if found.kind == SANDBOX:
                store.put(SANDBOX, found.id, _sandbox(found, launcher, cni).to_record())
                out.pods.add(found.id)
            else:
                c = _container(found, launcher)
                store.put(CONTAINER, found.id, c.to_record())
                refs.append(c.image_ref)
                out.containers += 1
        except (OSError, ValueError, TypeError, KeyError) as e:
            # Its process (if any) runs on unwatched: named, so a person can end it.
            why = getattr(e, "strerror", None) or e
            log.error("bundle %s has no usable record (%s: %s): not rebuilt; its process, "
                      "if any, is not pycri's to manage", bundle, type(e).__name__, why)
            continue
        snapshots |= found.snapshots
    out.images = images.rebuild(snapshots, refs)
    return out


async def _sweep_unrecorded(root: Path, state: Path, pods: set[str]) -> None:
    """What a pod with no bundle left (a RunPodSandbox cut short before its infra, a
    pod whose state went with a reboot) holds under pycri's own directories: its files,
    its /dev/shm and user namespace pins, and the network namespace named after it.
    Its CNI state is released by the recheck, as for any vanished pod."""
    found = {d.name for base in (root / "sandboxes", state / "sandboxes") if base.is_dir()
             for d in base.iterdir()} - pods
    for sid in sorted(found):
        try:
            await remove_netns(NETNS_RUN_DIR / f"pycri-{sid}")
            await asyncio.to_thread(_remove_pod_dirs, root / "sandboxes" / sid,
                                    state / "sandboxes" / sid)
        except (OSError, PycriError) as e:
            log.error("pod %s left by a crash or a reboot: not all removed: %s", sid, e)
            continue
        log.info("removed pod %s, left by a crash or a reboot with no record", sid)


def _remove_pod_dirs(pod_dir: Path, state_dir: Path) -> None:
    podfiles.unmount(state_dir / "shm")
    userns.unpin_userns(state_dir / "userns")
    shutil.rmtree(state_dir, ignore_errors=True)
    shutil.rmtree(pod_dir, ignore_errors=True)


def _process(launcher: Launcher, oid: str) -> tuple[int, int, Identity | None]:
    """(pid, conmon pid, the process's identity): the identity only while its conmon
    still watches it, so a pid reused since is never taken for it."""
    monitor = launcher.persist_dir(oid)
    pid = conmon.read_pid(conmon.pid_file(monitor))
    conmon_pid = conmon.read_pid(conmon.conmon_pid_file(monitor))
    alive = bool(conmon_pid) and conmon.is_monitor_of(conmon_pid, oid)
    return pid, conmon_pid, identity_of(pid) if pid and alive else None


def _sandbox(found: beside.Beside, launcher: Launcher, cni: CNIManager) -> Sandbox:
    """READY while its infra was created (the recheck makes it NOTREADY if the infra is
    gone); its addresses and whether its network is up, from the CNI cache."""
    sb = Sandbox.from_record(found.id, found.record)
    pid, conmon_pid, ident = _process(launcher, sb.id)
    sb.infra_pid, sb.conmon_pid = pid, conmon_pid
    sb.infra_start = ident.start if ident else 0
    sb.state = pb.SANDBOX_READY if pid else pb.SANDBOX_NOTREADY
    ips = None if sb.host_network else cni.cached_ips(sb.id)
    sb.ips, sb.network_torn_down = ips or [], ips is None and not sb.host_network
    return sb


def _container(found: beside.Beside, launcher: Launcher) -> Container:
    """CREATED while its process was created (the recheck learns whether it runs or
    exited), or restored from a checkpoint still to start; UNKNOWN otherwise (a
    create cut short, removed by the recheck)."""
    c = Container.from_record(found.id, found.record)
    pid, conmon_pid, ident = _process(launcher, c.id)
    c.pid, c.conmon_pid, c.pid_start = pid, conmon_pid, ident.start if ident else 0
    images = launcher.bundle_dir(c.id) / CHECKPOINT_DIR
    if pid:
        c.state = pb.CONTAINER_CREATED
    elif Path(images).is_dir():
        c.state, c.restore_images = pb.CONTAINER_CREATED, str(images)
    else:
        c.state = pb.CONTAINER_UNKNOWN
    return c
