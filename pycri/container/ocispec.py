"""A container's OCI spec from its records and what its rootfs and pod hold (the
user from the image's passwd and group, the seccomp profile, the pod's namespaces and
files). The identity and the spec read files that may block: they run in worker threads.
"""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.cdi.schema import ContainerEdits
from pycri.container.base import ContainerBase
from pycri.devices import host_devices, resolve_device
from pycri.errors import NotFound
from pycri.oci import mounts, seccomp, selinux, spec
from pycri.oci.users import ResolvedUser, UserRequest, resolve_user_in_rootfs
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox


class ContainerSpec(ContainerBase):
    """What the create pipeline builds the spec from; reads, never makes anything."""

    @staticmethod
    def _read_identity(
        c: Container, image: spec.ImageConfig, rootfs: Path
    ) -> tuple[ResolvedUser, dict[str, Any] | None]:
        """The user from the image's passwd/group and the seccomp profile: file reads that
        may block (a FIFO, a slow disk), so they run in a worker thread."""
        sc = c.config.linux.security_context
        user = resolve_user_in_rootfs(
            str(rootfs),
            UserRequest(
                run_as_user=sc.run_as_user.value if sc.HasField("run_as_user") else None,
                run_as_group=sc.run_as_group.value if sc.HasField("run_as_group") else None,
                run_as_username=sc.run_as_username,
                image_user=image.user,
                supplemental_groups=tuple(sc.supplemental_groups),
                strict_groups=sc.supplemental_groups_policy == pb.SupplementalGroupsPolicy.Strict,
            ),
        )
        profile = seccomp.load_profile(
            sc.seccomp if sc.HasField("seccomp") else None, sc.seccomp_profile_path
        )
        return user, profile

    def _spec(
        self,
        c: Container,
        sb: Sandbox,
        image: spec.ImageConfig,
        rootfs: Path,
        volumes: dict[str, str],
        user: ResolvedUser,
        profile: dict[str, Any] | None,
        pid_ns: str | None,
        cdi_edits: builtins.list[ContainerEdits],
    ) -> dict[str, Any]:
        """The container's OCI spec; runs in a worker thread and only reads the records."""
        config = c.config
        sc = config.linux.security_context
        sources = dict(volumes)
        for m in config.mounts:
            if m.image.image:
                continue
            host = mounts.validate_host_path(m.host_path)
            mounts.check_propagation(host.path, m.propagation)
            sources[m.host_path] = host.path
        devices = [d for dev in config.devices for d in resolve_device(dev)]
        ns = sb.config.linux.security_context.namespace_options
        infra = f"/proc/{sb.infra_pid}/ns"
        pod_dir = self.sandboxes.pod_dir(sb.id)
        ctx = spec.ContainerContext(
            container_id=c.id,
            sandbox_id=sb.id,
            rootfs=str(rootfs),
            user=user,
            net_ns=sb.netns or None,
            ipc_ns=f"{infra}/ipc" if ns.ipc != pb.NODE else None,
            uts_ns=f"{infra}/uts" if ns.network != pb.NODE else None,
            pid_ns=pid_ns,
            hostname=(pod_dir / "hostname").read_text().strip(),
            hostname_path=str(pod_dir / "hostname"),
            resolv_conf_path=str(pod_dir / "resolv.conf"),
            hosts_path=str(pod_dir / "hosts"),
            shm_path=self.sandboxes.shm_source(sb),
            seccomp=profile,
            cgroup_parent=sb.cgroup_parent,
            cgroup_driver=self.cfg.cgroup_driver,
            min_oom_score_adj=self.sandboxes.min_oom_score_adj,
            available_capabilities=self.sandboxes.capabilities,
            devices=devices,
            host_devices=host_devices() if sc.privileged else (),
            mount_sources=sources,
            selinux_enabled=self.sandboxes.selinux,
            userns=self.sandboxes.userns(sb),
            cdi_edits=cdi_edits,
        )
        if not self.sandboxes.selinux:
            selinux.ignored(f"container {c.id}", selinux.container_fields(config))
        return spec.container_spec(config, sb.config, image, ctx)

    def _pid_ns(self, c: Container, sb: Sandbox) -> str | None:
        mode = c.config.linux.security_context.namespace_options.pid
        if mode == pb.POD:
            return f"/proc/{sb.infra_pid}/ns/pid"
        if mode == pb.TARGET:
            target_id = c.config.linux.security_context.namespace_options.target_id
            target = self.find(target_id)
            if target is None or target.state != pb.CONTAINER_RUNNING:
                raise NotFound(f"target container {target_id!r} is not running")
            return f"/proc/{target.pid}/ns/pid"
        return None
