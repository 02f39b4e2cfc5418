"""SELinux: whether the host enforces it, and the labels a CRI SELinuxOption asks for.

Without SELinux (this project's hosts) the CRI's SELinux fields mean nothing: a label
the kernel has no policy for cannot be set, and a runtime asked to set one fails. So
`enabled()` is probed once by the managers and handed to the pure spec generator as an
input; only where it is true do `selinux_options` become labels and
`Mount.selinux_relabel` the `z` relabel option. Elsewhere each field present is noted
in one debug line per request (`ignored`), never refused: the kubelet sends them for
every pod whose spec names an SELinux context, whatever the node.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pycri.api import api_pb2 as pb

log = logging.getLogger(__name__)

SELINUXFS = Path("/sys/fs/selinux")

# The parts a partial option leaves out, as container runtimes default them: the
# process runs as container_t, its files are container_file_t, both at level s0.
PROCESS_DEFAULT = ("system_u", "system_r", "container_t", "s0")
FILE_DEFAULT = ("system_u", "object_r", "container_file_t", "s0")


def enabled(selinuxfs: Path = SELINUXFS) -> bool:
    """True where the kernel has SELinux loaded (its filesystem offers `enforce`),
    whether enforcing or permissive: permissive still records labels."""
    return (selinuxfs / "enforce").is_file()


def process_label(opt: pb.SELinuxOption) -> str:
    """`user:role:type:level` for process.selinuxLabel; unset parts from the default."""
    user, role, type_, level = PROCESS_DEFAULT
    return ":".join(
        (opt.user or user, opt.role or role, opt.type or type_, opt.level or level)
    )


def mount_label(opt: pb.SELinuxOption) -> str:
    """The label of the container's files (linux.mountLabel): the option's user and
    level (its MCS categories) apply to files too; role and type are the process's."""
    user, role, type_, level = FILE_DEFAULT
    return ":".join((opt.user or user, role, type_, opt.level or level))


def ignored(what: str, fields: list[str]) -> None:
    """One debug line per SELinux field present in a request on a host without SELinux."""
    for name in fields:
        log.debug("%s: %s ignored: SELinux is not enabled on this host", what, name)


def sandbox_fields(config: pb.PodSandboxConfig) -> list[str]:
    """The SELinux fields a RunPodSandbox request sets (dotted, from `config`)."""
    sc = config.linux.security_context
    return ["linux.security_context.selinux_options"] if sc.HasField("selinux_options") else []


def container_fields(config: pb.ContainerConfig) -> list[str]:
    """The SELinux fields a CreateContainer request sets (dotted, from `config`); the
    mounts asking for a relabel are named together, in one line."""
    out = []
    if config.linux.security_context.HasField("selinux_options"):
        out.append("linux.security_context.selinux_options")
    relabel = [str(i) for i, m in enumerate(config.mounts) if m.selinux_relabel]
    if relabel:
        shown = ",".join(relabel[:8]) + (f",… ({len(relabel)} in all)" if len(relabel) > 8 else "")
        out.append(f"mounts[{shown}].selinux_relabel")
    return out
