"""pycri's records as the containerd objects cAdvisor's containerd plugin reads: a pod
sandbox or container as a containerd container in the `k8s.io` namespace, its infra
or init process as the container's task. Pure: the door looks records up and reads
the spec; this decides what the answer says.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import any_pb2, timestamp_pb2

from pycri.api import api_pb2 as pb
from pycri.cadvisor.api import containerd_pb2 as ctrd
from pycri.errors import NotFound
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox

NAMESPACE = "k8s.io"  # the namespace the kubelet's cAdvisor asks in (--containerd-namespace)
# The label cAdvisor's plugin reads to tell the pod's network holder from its containers
# (it reports network stats for `sandbox` only), and containerd's values for it.
KIND_LABEL = "io.cri-containerd.kind"
SPEC_TYPE_URL = "types.containerd.io/opencontainers/runtime-spec/1/Spec"
RUNTIME_NAME = "io.containerd.runc.v2"  # what cAdvisor may show; it runs nothing by it


@dataclass(frozen=True)
class Task:
    """A task as Tasks/Get reports it: the object's main process."""

    pid: int
    status: int  # ctrd.TaskStatus
    exit_status: int = 0
    exited_at: int = 0  # ns since the epoch; 0 while running


def _timestamp(ns: int) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(ns)
    return ts


def _container(oid: str, labels: dict[str, str], image: str, spec: bytes, created_at: int,
               sandbox: str) -> ctrd.Container:  # fmt: skip
    return ctrd.Container(
        id=oid,
        labels=labels,
        image=image,
        runtime=ctrd.Container.Runtime(name=RUNTIME_NAME),
        spec=any_pb2.Any(type_url=SPEC_TYPE_URL, value=spec),
        created_at=_timestamp(created_at),
        updated_at=_timestamp(created_at),
        sandbox=sandbox,
    )


def of_sandbox(sb: Sandbox, image: str, spec: bytes) -> ctrd.Container:
    """The pod's infra as containerd shows a pod sandbox: the pod's CRI labels (name,
    namespace, UID: what the kubelet joins on) and kind `sandbox`."""
    labels = dict(sb.config.labels)
    labels[KIND_LABEL] = "sandbox"
    return _container(sb.id, labels, image, spec, sb.created_at, sb.id)


def of_container(c: Container, image: str, spec: bytes) -> ctrd.Container:
    """A CRI container: its CRI labels (the kubelet's container name, pod name,
    namespace, UID) and kind `container`."""
    labels = dict(c.config.labels)
    labels[KIND_LABEL] = "container"
    return _container(c.id, labels, image, spec, c.created_at, c.sandbox_id)


def sandbox_task(sb: Sandbox) -> Task:
    """The infra process; NotFound before it exists (cAdvisor asks again) and once it
    is gone with a stopped pod."""
    if not sb.infra_pid:
        raise NotFound(f"no task for pod sandbox {sb.id}")
    if sb.state == pb.SANDBOX_READY:
        return Task(sb.infra_pid, ctrd.RUNNING)
    return Task(sb.infra_pid, ctrd.STOPPED)


def container_task(c: Container) -> Task:
    """The container's init, in containerd's task states: CREATED once the runtime made
    it, RUNNING once started, STOPPED with its exit code once it exited."""
    if not c.pid:
        raise NotFound(f"no task for container {c.id}")
    if c.state == pb.CONTAINER_RUNNING:
        return Task(c.pid, ctrd.RUNNING)
    if c.state == pb.CONTAINER_EXITED:
        return Task(c.pid, ctrd.STOPPED, c.exit_code & 0xFFFFFFFF, c.finished_at)
    return Task(c.pid, ctrd.CREATED)


def process(oid: str, task: Task) -> ctrd.Process:
    """The task's process as Tasks/Get answers it (the init's ID is the container's)."""
    out = ctrd.Process(container_id=oid, id=oid, pid=task.pid, status=task.status,  # type: ignore[arg-type]
                       exit_status=task.exit_status)
    if task.exited_at:
        out.exited_at.CopyFrom(_timestamp(task.exited_at))
    return out

