"""NRI resources on the UpdateContainerResources path.

`to_cri_resources` puts an NRI `LinuxResources` on top of a container's CRI resources,
for the existing UpdateContainerResources path (`apply_updates`, which runs the OCI
runtime's `update`), and refuses by name what the CRI cannot carry.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument, PycriError
from pycri.gate import check_request
from pycri.nri.api import api_pb2 as api
from pycri.nri.checks import AdjustmentError, _cri_overlay
from pycri.nri.domain import Containers

log = logging.getLogger(__name__)

# NRI resource fields the CRI's LinuxContainerResources has no place for: settable at
# create (straight into the OCI spec), but not through the UpdateContainerResources path.
_NOT_IN_CRI = (
    ("memory", "reservation", "memory reservation"),
    ("memory", "kernel", "kernel memory limit"),
    ("memory", "kernel_tcp", "kernel TCP memory limit"),
    ("memory", "swappiness", "memory swappiness"),
    ("memory", "disable_oom_killer", "disable_oom_killer"),
    ("memory", "use_hierarchy", "memory use_hierarchy"),
    ("cpu", "realtime_runtime", "CPU realtime runtime"),
    ("cpu", "realtime_period", "CPU realtime period"),
)


def to_cri_resources(
    base: pb.LinuxContainerResources, r: api.LinuxResources, who: str = "update"
) -> pb.LinuxContainerResources:
    """`base` with the NRI resources `r` on top, checked by the CRI's own rules, for
    UpdateContainerResources. What the CRI cannot express is refused by name."""
    missing = [label for part, name, label in _NOT_IN_CRI if getattr(r, part).HasField(name)]
    if r.HasField("pids"):
        missing.append("pids limit")
    if r.HasField("blockio_class"):
        missing.append("block I/O class")
    if r.HasField("rdt_class"):
        missing.append("RDT class")
    if r.devices:
        missing.append("device cgroup rules")
    if missing:
        raise AdjustmentError(f"NRI {who}: {', '.join(missing)} cannot be changed on a "
                              "running container by pycri")
    out = pb.LinuxContainerResources()
    out.CopyFrom(base)
    try:
        _cri_overlay(out, r)
        check_request(out)
    except (InvalidArgument, ValueError) as e:
        raise AdjustmentError(f"NRI {who}: resources: {e}") from None
    return out


async def apply_updates(
    containers: Containers, updates: Sequence[api.ContainerUpdate]
) -> list[api.ContainerUpdate]:
    """Apply each update through the UpdateContainerResources path (the OCI runtime's
    `update`); return the ones that failed, except those whose asker ignores failure.

    One container's failure does not stop the others': there is no undoing what the
    runtime already changed in another container's cgroup.
    """
    failed: list[api.ContainerUpdate] = []
    for u in updates:
        try:
            await containers.change_resources(u.container_id, functools.partial(
                to_cri_resources, r=u.linux.resources,
                who=f"update of container {u.container_id}"))
        except PycriError as e:
            log.warning("NRI update of container %s failed: %s", u.container_id, e)
            if not u.ignore_failure:
                failed.append(u)
    return failed
