"""Pod sandbox lifecycle: RunPodSandbox, StopPodSandbox, RemovePodSandbox, status, list.

A sandbox is the pod's network namespace (wired by CNI), its shared files
(hostname, hosts, resolv.conf, /dev/shm) and an infra process that holds the
IPC/UTS/PID namespaces. Every step RunPodSandbox takes is undone, in reverse,
when a later one fails, and the error names the step.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Protocol

from google.protobuf import json_format

from pycri import events
from pycri.api import api_pb2 as pb
from pycri.config import Config
from pycri.errors import FailedPrecondition, InvalidArgument, NotFound, PycriError, step
from pycri.events import Event, EventBus
from pycri.image.manager import ImageManager
from pycri.image.snapshots import Idmap
from pycri.launcher import Launcher
from pycri.monitor.probe import Fact, Probe, identity_of
from pycri.names import matches_labels, new_id
from pycri.network import (
    DNS,
    Bandwidth,
    CNIManager,
    PodNetwork,
    PortMapping,
    create_netns,
    remove_netns,
)
from pycri.network.cache import CorruptEntry
from pycri.network.netns import NETNS_RUN_DIR
from pycri.nri.adaptation import Adaptation
from pycri.oci import mounts, seccomp, selinux, spec, userns
from pycri.oci.rootfs import pin_mount_destinations
from pycri.oci.users import ResolvedUser
from pycri.recovery import probed
from pycri.sandbox import podcgroup, podfiles
from pycri.store import Store
from pycri.store.records import Records
from pycri.store.sandbox import KIND, Sandbox, name_key
from pycri.together import all_settled, in_thread, sparing

log = logging.getLogger(__name__)

INFRA_STOP_TIMEOUT = 10.0
PROTOCOLS = {pb.TCP: "tcp", pb.UDP: "udp", pb.SCTP: "sctp"}
INGRESS_ANNOTATION = "kubernetes.io/ingress-bandwidth"
EGRESS_ANNOTATION = "kubernetes.io/egress-bandwidth"
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|K|M|G|T)?$")
_SCALE = {
    None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}  # fmt: skip


class PodContainers(Protocol):
    """What the sandbox lifecycle needs from the container lifecycle."""

    async def stop_all(self, sandbox_id: str) -> None: ...

    async def remove_all(self, sandbox_id: str) -> None: ...


def parse_bandwidth(value: str) -> int:
    """A Kubernetes quantity ("10M", "1Gi") in bits per second."""
    m = _QUANTITY.match(value.strip())
    if not m:
        raise InvalidArgument(f"bandwidth {value!r} is not a quantity like 10M")
    return int(float(m.group(1)) * _SCALE[m.group(2)])


def own_oom_score_adj() -> int:
    with open("/proc/self/oom_score_adj") as f:
        return int(f.read().strip())


def own_capabilities() -> tuple[str, ...]:
    """The daemon's bounding set: a container can never get more (no CAP_SYS_RESOURCE here)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapBnd:"):
                return tuple(spec.capabilities_from_mask(int(line.split()[1], 16)))
    return tuple(spec.ALL_CAPABILITIES)


class SandboxManager:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        launcher: Launcher,
        cni: CNIManager,
        images: ImageManager,
        events: EventBus,
        nri: Adaptation,
    ) -> None:
        self.cfg = cfg
        self.events = events
        self.store = store
        self.launcher = launcher
        self.cni = cni
        self.images = images
        self.nri = nri
        self.containers: PodContainers | None = None
        self.sandboxes: Records[Sandbox] = Records("pod sandbox")
        # RunPodSandbox in flight: not listed until READY (nor while NRI plugins see it).
        self._running: set[str] = set()
        self.pod_root = Path(cfg.root) / "sandboxes"
        self.state_root = Path(cfg.state) / "sandboxes"
        self.min_oom_score_adj = own_oom_score_adj() if cfg.restrict_oom_score_adj else -1000
        self.capabilities = own_capabilities()
        self.selinux = selinux.enabled()
        # What this host can do for pods with their own user namespace (probed at start).
        self.userns_support: userns.Support | None = None
        self.unchecked: set[str] = set()  # loaded at start, state not rechecked yet

    # -- lookup ------------------------------------------------------------------

    def get(self, sid: str) -> Sandbox:
        """By full ID or unique prefix; NotFound otherwise."""
        return self.sandboxes.lookup(sid)

    def find(self, sid: str) -> Sandbox | None:
        return self.sandboxes.find(sid)

    def pod_dir(self, sid: str) -> Path:
        return self.pod_root / sid

    def state_dir(self, sid: str) -> Path:
        return self.state_root / sid

    def shm_path(self, sb: Sandbox) -> Path | None:
        """The pod's own /dev/shm mount; None when the pod shares the host's IPC."""
        ipc = sb.config.linux.security_context.namespace_options.ipc
        return None if ipc == pb.NODE else self.state_dir(sb.id) / "shm"

    def shm_source(self, sb: Sandbox) -> str:
        """What containers bind at /dev/shm."""
        shm = self.shm_path(sb)
        return str(shm) if shm else "/dev/shm"

    def userns(self, sb: Sandbox) -> spec.UserNamespace | None:
        """The pod's own user namespace (pinned in its state dir), if it has one."""
        maps = spec.pod_id_maps(sb.config)
        if maps is None:
            return None
        return spec.UserNamespace(str(self.state_dir(sb.id) / "userns"), *maps)

    def idmap(self, sb: Sandbox) -> Idmap | None:
        """How the pod's layers and volumes are shown to its user namespace, if it has one."""
        ns = self.userns(sb)
        if ns is None:
            return None
        return Idmap(Path(ns.path), ns.uids[0].host_id, ns.gids[0].host_id)

    def _check_userns_support(self, config: pb.PodSandboxConfig, runtime_handler: str) -> None:
        if spec.pod_id_maps(config) is None:
            return
        support = self.userns_support
        problem = support.problem(runtime_handler) if support else "not probed"
        if problem:
            raise FailedPrecondition(
                f"runtime handler {runtime_handler!r} cannot run pods with their own user "
                f"namespace on this host: {problem}")

    def _save(self, sb: Sandbox) -> None:
        sb.revision += 1
        self.store.put(KIND, sb.id, sb.to_record())
        self.sandboxes.put(sb)

    # -- run ---------------------------------------------------------------------

    async def run(self, config: pb.PodSandboxConfig, runtime_handler: str) -> str:
        md = config.metadata  # checked by the request gate (gate.py)
        handler = self.launcher.handler_name(runtime_handler)
        # Before the name is reserved: a refusal must leave it free for a retry.
        self._check_userns_support(config, runtime_handler)
        sid = new_id()
        self.sandboxes.reserve(name_key(md), sid)
        sb = Sandbox(
            id=sid,
            config=config,
            handler=handler,
            runtime_handler=runtime_handler,
            created_at=time.time_ns(),
            cgroup_parent=config.linux.cgroup_parent,
        )
        self._running.add(sid)
        try:
            async with self.sandboxes.lock(sid), AsyncExitStack() as undo:
                # Written first, so a crash half-way leaves a NOTREADY pod that
                # StopPodSandbox/RemovePodSandbox can still clean up.
                self._save(sb)
                undo.callback(self._forget, sb)
                await self._setup(sb, undo)
                async with step("NRI RunPodSandbox"):
                    undo.push_async_callback(self.nri.undo_run_pod_sandbox, sb)
                    await self.nri.run_pod_sandbox(sb)
                sb.state = pb.SANDBOX_READY
                self._save(sb)
                undo.pop_all()
        except BaseException:
            self.sandboxes.release(name_key(md), sid)
            self.sandboxes.unlock(sid)
            raise
        finally:
            self._running.discard(sid)
        self._publish(sb, events.CREATED)
        self._publish(sb, events.STARTED)
        log.info("pod sandbox %s (%s/%s) ready, ips %s", sid, md.namespace, md.name, sb.ips)
        return sid

    def _publish(self, sb: Sandbox, kind: int) -> None:
        """Sandboxes report their own lifecycle as container events, as the kubelet expects."""
        self.events.publish(Event(sb.id, sb.id, kind, time.time_ns()))

    def _forget(self, sb: Sandbox) -> None:
        self.store.delete(KIND, sb.id)
        self.sandboxes.drop(sb)

    async def _setup(self, sb: Sandbox, undo: AsyncExitStack) -> None:
        config = sb.config
        pod_dir, state_dir = self.pod_dir(sb.id), self.state_dir(sb.id)
        ns = self.userns(sb)
        idmap = self.idmap(sb)
        owner = (idmap.uid, idmap.gid) if idmap else None
        async with step("writing pod files"):
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            undo.callback(shutil.rmtree, state_dir, True)
            podfiles.write_pod_files(pod_dir, config, sb.host_network, owner)
            undo.callback(shutil.rmtree, pod_dir, True)
        await self._pod_cgroup(sb, undo)
        shm = self.shm_path(sb)
        if shm is not None:
            async with step("mounting /dev/shm"):
                podfiles.mount_shm(shm, owner=owner)
                undo.callback(podfiles.unmount, shm)
        if ns is not None:  # the gate allows no host network with a user namespace
            async with step("creating the pod's user and network namespaces"):
                sb.netns = str(NETNS_RUN_DIR / f"pycri-{sb.id}")
                self._save(sb)
                undo.push_async_callback(remove_netns, sb.netns)
                undo.callback(userns.unpin_userns, Path(ns.path))
                await userns.create_pod_namespaces(
                    Path(ns.path), f"pycri-{sb.id}", ns.uids, ns.gids)
        elif not sb.host_network:
            async with step("creating the network namespace"):
                # Path saved and undo pushed first: a crash or cancel during the create
                # must not leave a pinned namespace nobody knows about.
                sb.netns = str(NETNS_RUN_DIR / f"pycri-{sb.id}")
                self._save(sb)
                undo.push_async_callback(remove_netns, sb.netns)
                await create_netns(f"pycri-{sb.id}")
        # The network and the infra need only the pinned namespace: wired at once. A failed
        # ADD cuts the infra's creation short; a failed infra lets the ADD finish (its
        # plugins are never killed half-way for it), and both are then undone.
        await sparing(self._network_up(sb, undo), self._infra_up(sb, undo, idmap))

    async def _network_up(self, sb: Sandbox, undo: AsyncExitStack) -> None:
        """CNI ADD into the pod's network namespace (none for a host-network pod)."""
        if sb.host_network:
            return
        pod_net = self.pod_network(sb)
        async with step("setting up the pod network (CNI)"):
            undo.push_async_callback(self.cni.teardown, pod_net)
            result = await self.cni.setup(pod_net)
            sb.ips = list(result.ips)
            podfiles.add_hosts_entry(self.pod_dir(sb.id), sb.ips,
                                     podfiles.pod_hostname(sb.config, sb.host_network))

    async def _infra_up(self, sb: Sandbox, undo: AsyncExitStack, idmap: Idmap | None) -> None:
        """The infra process: created by conmon, then started."""
        owner = (idmap.uid, idmap.gid) if idmap else None
        image: spec.ImageConfig | None = None
        rootfs = self.pod_dir(sb.id) / "rootfs"
        if self.cfg.pause_image:
            async with step(f"preparing the pause image {self.cfg.pause_image}"):
                undo.push_async_callback(self.images.remove_rootfs, sb.id)  # absent is fine
                image, rootfs = await self._pause_rootfs(sb, idmap)
        else:
            rootfs.mkdir(exist_ok=True)
            if owner is not None:  # runc makes /proc, /dev, ... in it as the pod's root
                os.chown(rootfs, *owner)
        async with step("starting the infra container"):
            if idmap is not None:
                staging = mounts.rootfs_staging(self.cfg.state, sb.id)
                undo.callback(mounts.unstage_all, staging)
                rootfs = await in_thread(
                    mounts.stage_rootfs, str(rootfs), staging, idmap.uid, idmap.gid)
            spec_doc = await asyncio.to_thread(self._infra_spec, sb, rootfs, image)
            created = await self.launcher.create(
                sb.id, spec_doc, sb.handler, self.state_dir(sb.id) / "infra.log"
            )
            undo.push_async_callback(self.launcher.delete, sb.id, sb.handler)
            undo.push_async_callback(self._kill_infra, sb)
            await self.launcher.start(sb.id, sb.handler)
            sb.infra_pid, sb.conmon_pid = created.pid, created.conmon_pid
            sb.infra_start = created.start_time

    async def _pod_cgroup(self, sb: Sandbox, undo: AsyncExitStack) -> None:
        """A pod without a cgroup_parent that sets pod-level limits gets a pod cgroup of
        pycri's own, holding them (podcgroup.py); one the kubelet names is never written."""
        limits = spec.pod_limits(sb.config.linux)
        if not limits or sb.config.linux.cgroup_parent:
            return
        if self.cfg.cgroup_driver != "cgroupfs":
            log.info("pod %s: pod-level limits only reach the handler (annotations): "
                     "pycri makes no pod cgroup under the %s driver", sb.id,
                     self.cfg.cgroup_driver)
            return
        async with step("creating the pod cgroup"):
            sb.cgroup_parent, sb.own_cgroup = podcgroup.path_for(sb.id), True
            self._save(sb)  # first: a crash during the create leaves it to RemovePodSandbox
            undo.push_async_callback(asyncio.to_thread, podcgroup.remove, sb.cgroup_parent,
                                     sb.id)
            await in_thread(podcgroup.create, sb.cgroup_parent, limits)

    async def _pause_rootfs(
        self, sb: Sandbox, idmap: Idmap | None
    ) -> tuple[spec.ImageConfig, Path]:
        """The configured pause image's rootfs (pulled on first use; pinned by config)."""
        ref = self.cfg.pause_image
        image = self.images.status(ref)
        image_id = image.id if image else await self.images.pull(ref)
        rootfs = await self.images.prepare_rootfs(sb.id, image_id, idmap)
        return spec.ImageConfig.from_oci(self.images.image_config(image_id)), rootfs

    def _infra_spec(
        self, sb: Sandbox, rootfs: Path, image: spec.ImageConfig | None
    ) -> dict[str, Any]:
        """Runs in a worker thread: it reads the seccomp profile and walks the pause rootfs."""
        config = sb.config
        sc = config.linux.security_context
        uid = sc.run_as_user.value if sc.HasField("run_as_user") else 0
        gid = sc.run_as_group.value if sc.HasField("run_as_group") else 0
        profile = seccomp.load_profile(
            sc.seccomp if sc.HasField("seccomp") else None, sc.seccomp_profile_path
        )
        ctx = spec.SandboxContext(
            sandbox_id=sb.id,
            rootfs=str(rootfs),
            user=ResolvedUser(uid, gid, (gid,)),
            infra_binary=self.cfg.infra_binary,
            image=image,
            net_ns=sb.netns or None,
            shm_path=self.shm_source(sb),
            seccomp=profile,
            cgroup_parent=sb.cgroup_parent,
            cgroup_driver=self.cfg.cgroup_driver,
            min_oom_score_adj=self.min_oom_score_adj,
            available_capabilities=self.capabilities,
            selinux_enabled=self.selinux,
            userns=self.userns(sb),
        )
        if not self.selinux:
            selinux.ignored(f"pod sandbox {sb.id}", selinux.sandbox_fields(config))
        doc = spec.sandbox_spec(config, ctx)
        if image is not None:  # a pause image is as untrusted as any other image
            pin_mount_destinations(str(rootfs), doc)
        return doc

    def pod_network(self, sb: Sandbox) -> PodNetwork:
        config = sb.config
        md = config.metadata
        bw_in = config.annotations.get(INGRESS_ANNOTATION)
        bw_out = config.annotations.get(EGRESS_ANNOTATION)
        bandwidth = None
        if bw_in or bw_out:
            bandwidth = Bandwidth(
                ingress=parse_bandwidth(bw_in) if bw_in else None,
                egress=parse_bandwidth(bw_out) if bw_out else None,
            )
        dns = config.dns_config
        return PodNetwork(
            sandbox_id=sb.id,
            netns=sb.netns,
            name=md.name,
            namespace=md.namespace,
            uid=md.uid,
            port_mappings=tuple(
                PortMapping(
                    protocol=PROTOCOLS.get(p.protocol, "tcp"),
                    container_port=p.container_port,
                    host_port=p.host_port,
                    host_ip=p.host_ip,
                )
                for p in config.port_mappings
                if p.host_port > 0
            ),
            bandwidth=bandwidth,
            dns=DNS(tuple(dns.servers), tuple(dns.searches), tuple(dns.options))
            if (dns.servers or dns.searches or dns.options)
            else None,
            cgroup_path=sb.cgroup_parent,
        )

    async def _kill_infra(self, sb: Sandbox) -> None:
        """SIGKILL the infra and wait for conmon's exit report (if the runtime knows it)."""
        if self.launcher.exit_code(sb.id) is not None:
            return
        if await self.launcher.state(sb.id, sb.handler) is None:
            return  # gone with a reboot, or never created
        await self.launcher.kill(sb.id, sb.handler, signal.SIGKILL)
        if not await self.launcher.wait_exit(sb.id, INFRA_STOP_TIMEOUT):
            log.warning("infra of pod %s did not exit within %ss", sb.id, INFRA_STOP_TIMEOUT)

    # -- stop / remove -------------------------------------------------------------

    async def stop(self, sid: str) -> None:
        """Stop containers and infra, tear the network down. Unknown IDs succeed."""
        async with self.sandboxes.held(sid) as sb:
            if sb is not None:
                await self._stop_locked(sb)

    async def _stop_locked(self, sb: Sandbox) -> None:
        # NOTREADY first: no CreateContainer gets past its readiness check after this
        # (so none escapes stop_all), and the infra exit that follows is not a crash.
        if sb.state == pb.SANDBOX_READY:
            sb.state = pb.SANDBOX_NOTREADY
            self._save(sb)
            self._publish(sb, events.STOPPED)
        if self.containers is not None:
            await self.containers.stop_all(sb.id)
        # Plugins hear of it with the containers stopped and the pod still reachable.
        await self.nri.stop_pod_sandbox(sb)
        # The infra holds no network of its own (the namespace is pinned): both at once,
        # and both to their end, so a failed DEL still leaves the infra stopped.
        await all_settled(self._infra_down(sb), self._network_down(sb))
        if sb.netns:
            async with step("removing the network namespace"):
                await remove_netns(sb.netns)
        if (ns := self.userns(sb)) is not None:
            userns.unpin_userns(Path(ns.path))
        shm = self.shm_path(sb)
        if shm is not None:
            podfiles.unmount(shm)

    async def _infra_down(self, sb: Sandbox) -> None:
        async with step("stopping the infra container"):
            await self._kill_infra(sb)  # decides on the runtime's state, not the record

    async def _network_down(self, sb: Sandbox) -> None:
        """CNI DEL, once: a failure fails the Stop and a later Stop runs it again."""
        if sb.host_network or sb.network_torn_down:
            return
        async with step("tearing down the pod network (CNI)"):
            await self.cni.teardown(self.pod_network(sb))
        sb.network_torn_down = True
        self._save(sb)

    async def remove(self, sid: str) -> None:
        """Stop if needed, then remove containers, infra, files and the record."""
        async with self.sandboxes.held(sid) as sb:
            if sb is None:
                return
            await self._stop_locked(sb)
            if self.containers is not None:
                await self.containers.remove_all(sb.id)
            await self.nri.remove_pod_sandbox(sb)
            async with step("deleting the infra container"):
                await self.launcher.delete(sb.id, sb.handler)
                await asyncio.to_thread(
                    mounts.unstage_all, mounts.rootfs_staging(self.cfg.state, sb.id))
                await self.images.remove_rootfs(sb.id)
            if sb.own_cgroup:
                await asyncio.to_thread(podcgroup.remove, sb.cgroup_parent, sb.id)
            shutil.rmtree(self.pod_dir(sb.id), ignore_errors=True)
            shutil.rmtree(self.state_dir(sb.id), ignore_errors=True)
            self._forget(sb)
            self.sandboxes.release(sb.name, sb.id)
            self._publish(sb, events.DELETED)
        self.sandboxes.unlock(sb.id)
        log.info("pod sandbox %s removed", sb.id)

    # -- pod resize -------------------------------------------------------------------

    async def update_resources(
        self, sid: str, overhead: pb.LinuxContainerResources | None,
        resources: pb.LinuxContainerResources | None,
    ) -> None:
        """UpdatePodSandboxResources: the pod's overhead and resources become these (an
        absent one is cleared, as containerd records it). Recorded in the pod's config
        in every case; written to the pod cgroup only when it is pycri's own
        (podcgroup.py), as at RunPodSandbox: a kubelet's cgroup_parent is the kubelet's
        to resize, and a pod that started without a pod cgroup has its containers in
        none to bound. A limit the kernel refuses leaves the old ones, and the record,
        as they were."""
        async with self.sandboxes.held(sid) as sb:
            if sb is None:
                raise NotFound(f"pod sandbox {sid!r} not found")
            async with step("NRI UpdatePodSandbox"):
                await self.nri.update_pod_sandbox(sb, overhead, resources)
            config = pb.PodSandboxConfig()
            config.CopyFrom(sb.config)
            for name, value in (("overhead", overhead), ("resources", resources)):
                config.linux.ClearField(name)
                if value is not None:
                    getattr(config.linux, name).CopyFrom(value)
            old = sb.config
            if sb.own_cgroup:
                try:
                    await asyncio.to_thread(podcgroup.update, sb.cgroup_parent,
                                            spec.pod_limits(config.linux))
                except OSError as e:
                    await self._restore_pod_limits(sb)
                    raise FailedPrecondition(
                        f"pod {sb.id}: the kernel refused the new pod-level limits "
                        f"({e.filename}: {e.strerror}); the old ones stay") from None
            elif spec.pod_limits(config.linux):
                log.info("pod %s: new pod-level limits recorded, not written: %s", sb.id,
                         "its cgroup_parent is the kubelet's" if sb.cgroup_parent
                         else "it has no pod cgroup of pycri's own")
            sb.config = config
            try:
                self._save(sb)
            except BaseException:
                sb.config = old
                if sb.own_cgroup:
                    await self._restore_pod_limits(sb)
                raise
        await self.nri.post_update_pod_sandbox(sb)

    async def _restore_pod_limits(self, sb: Sandbox) -> None:
        """Write the recorded limits back over a resize that did not complete."""
        try:
            await asyncio.to_thread(podcgroup.update, sb.cgroup_parent,
                                    spec.pod_limits(sb.config.linux))
        except OSError as e:
            log.error("pod %s: its recorded limits could not be restored: %s", sb.id, e)

    # -- status / list ----------------------------------------------------------------

    def list(
        self, flt: pb.PodSandboxFilter | pb.PodSandboxStatsFilter | None
    ) -> builtins.list[Sandbox]:
        """Sandboxes matching a ListPodSandbox or ListPodSandboxStats filter."""
        out = list(self.sandboxes.values())
        if self._running:
            out = [s for s in out if s.id not in self._running]
        if flt is None:
            return out
        if flt.id:
            out = [s for s in out if s.id.startswith(flt.id)]
        if isinstance(flt, pb.PodSandboxFilter) and flt.HasField("state"):
            out = [s for s in out if s.state == flt.state.state]
        if flt.label_selector:
            sel = dict(flt.label_selector)
            out = [s for s in out if matches_labels(dict(s.config.labels), sel)]
        return out

    def verbose_info(self, sb: Sandbox) -> dict[str, str]:
        info = {
            "pid": sb.infra_pid,
            "conmonPid": sb.conmon_pid,
            "netnsPath": sb.netns,
            "runtimeHandler": sb.handler,
            "ips": sb.ips,
            "cgroupParent": sb.cgroup_parent,
            # As RunPodSandbox or the last UpdatePodSandboxResources set them.
            "podResources": {name: json_format.MessageToDict(getattr(sb.config.linux, name))
                             for name in ("overhead", "resources")
                             if sb.config.linux.HasField(name)},
            "runtimeSpec": self.launcher.spec(sb.id),
        }
        return {"info": json.dumps(info)}

    # -- exits and recovery ------------------------------------------------------------

    def on_exit(self, oid: str, code: int, finished_at: int) -> None:
        """The infra process died: the pod is no longer ready."""
        sb = self.sandboxes.get(oid)
        if sb is not None and sb.state == pb.SANDBOX_READY:
            log.warning("infra of pod %s exited with %d; pod is NOTREADY", oid, code)
            sb.state = pb.SANDBOX_NOTREADY
            self._save(sb)
            self._publish(sb, events.STOPPED)

    async def recover(self) -> set[str]:
        """Reload the records, before the socket serves (no process, no runtime call);
        `recheck` then confirms that the READY ones still are. Returns their IDs."""
        for sb in self.store.load(KIND, self._load):
            self.sandboxes.put(sb)
        self.unchecked = set(self.sandboxes)
        return {sb.id for sb in self.sandboxes.values() if sb.state == pb.SANDBOX_READY}

    async def recheck(self, runtime_calls: asyncio.Semaphore) -> None:
        """A pod whose infra is gone (crash, reboot) comes back NOTREADY: decided from the
        facts on disk (see pycri/recovery.py); the runtime is asked, `runtime_calls` at a
        time, only about records of older pycris (no infra start time)."""
        found = [sb for sb in self.sandboxes.values() if sb.id in self.unchecked]
        revisions = {sb.id: sb.revision for sb in found}
        asks: builtins.list[asyncio.Task[None]] = []
        async for sb, facts in probed(found, self._probe):
            try:
                if isinstance(facts, Exception):
                    raise facts
                if self._apply_probe(sb, revisions[sb.id], *facts):
                    asks.append(asyncio.create_task(
                        self._ask_runtime(sb, revisions[sb.id], runtime_calls)))
                    continue
            except Exception as e:  # one bad object never stops the others' recheck
                log.error("pod %s: state not rechecked at start: %s", sb.id, e)
            self.unchecked.discard(sb.id)
        await asyncio.gather(*asks)
        await self._release_orphan_leases()

    def _apply_probe(self, sb: Sandbox, revision: int, probe: Probe, netns: bool) -> bool:
        """Act on what the disk says; True when only the runtime can tell."""
        if probe.conmon_pid and probe.fact not in (Fact.EXITED, Fact.LOST):
            self.launcher.watch_monitor(sb.id, probe.conmon_pid, probe.conmon_alive, sb.infra)
        if sb.state != pb.SANDBOX_READY or (probe.fact is Fact.RUNS and netns):
            return False
        if probe.fact is Fact.EXITED:
            if sb.revision == revision:
                self.on_exit(sb.id, probe.exit_code, probe.finished_at)
            return False
        if probe.fact is Fact.UNKNOWN and netns:
            return True
        self._not_survived(sb, revision)
        return False

    def _probe(self, sb: Sandbox) -> tuple[Probe, bool]:
        """The infra's facts, and whether the pod's network namespace is still there."""
        return self.launcher.probe(sb.id, sb.infra), not sb.netns or Path(sb.netns).exists()

    async def _ask_runtime(self, sb: Sandbox, revision: int,
                           runtime_calls: asyncio.Semaphore) -> None:
        state = None
        try:
            with contextlib.suppress(PycriError):
                async with runtime_calls:
                    state = await self.launcher.state(sb.id, sb.handler)
        finally:
            self.unchecked.discard(sb.id)
        running = state is not None and state.get("status") == "running"
        if running and state is not None and state.get("pid") == sb.infra_pid and (
                init := identity_of(sb.infra_pid)) and sb.revision == revision:
            sb.infra_start = init.start  # an older pycri's record: learn it now
            self._save(sb)
            revision = sb.revision
        if not running:
            self._not_survived(sb, revision)

    def _not_survived(self, sb: Sandbox, revision: int) -> None:
        """Mark a READY pod NOTREADY, unless an RPC changed (or removed) it meanwhile."""
        if (self.sandboxes.get(sb.id) is sb and sb.revision == revision
                and sb.state == pb.SANDBOX_READY):
            log.info("pod %s did not survive; marking NOTREADY", sb.id)
            sb.state = pb.SANDBOX_NOTREADY
            self._save(sb)

    def _load(self, sid: str, rec: dict[str, Any]) -> Sandbox:
        sb = Sandbox.from_record(sid, rec)
        self.sandboxes.reserve(sb.name, sid)
        return sb

    async def _release_orphan_leases(self) -> None:
        """CNI state with no sandbox behind it (a crash mid-run, a DEL that failed while
        the pod was being forgotten): tear it down once more, so no IP stays leased."""
        for sid in self.cni.cache.sandboxes():
            if sid in self.sandboxes:
                continue
            try:
                await self.cni.teardown(PodNetwork(sandbox_id=sid, netns="", name="",
                                                   namespace="", uid=""))
                log.info("released the CNI state of vanished pod %s", sid)
            except CorruptEntry as e:
                await self._set_cni_state_aside(sid, e)
            except PycriError as e:  # a plugin failed: kept for the next start
                log.warning("CNI state of vanished pod %s: %s", sid, e)
            except Exception as e:  # anything else a bad entry can cause
                await self._set_cni_state_aside(sid, e)

    async def _set_cni_state_aside(self, sid: str, error: Exception) -> None:
        try:
            where = await self.cni.cache.set_aside(sid)
        except OSError as e:
            log.error("CNI state of vanished pod %s is unusable (%s) and could not be set "
                      "aside: %s", sid, error, e)
            return
        log.error("CNI state of vanished pod %s is unusable (%s: %s); moved to %s",
                  sid, type(error).__name__, error, where)
