"""pycri/cadvisor/view.py: records as the containerd objects cAdvisor reads."""

from __future__ import annotations

import pytest

from pycri.api import api_pb2 as pb
from pycri.cadvisor import view
from pycri.cadvisor.api import containerd_pb2 as ctrd
from pycri.errors import NotFound
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox


def _container(**kw: object) -> Container:
    config = pb.ContainerConfig(labels={"io.kubernetes.container.name": "app"},
                                image=pb.ImageSpec(image="sha256:" + "1" * 64))
    return Container(id="c" * 64, sandbox_id="s" * 64, config=config, image_id="sha256:x",
                     image_ref="r", handler="runc", created_at=1_700_000_000_123_456_789,
                     log_path="", **kw)  # type: ignore[arg-type]


def test_container_labels_kind_and_creation_time() -> None:
    c = view.of_container(_container(), "127.0.0.1:5000/busybox:latest", b"{}")
    assert dict(c.labels) == {"io.kubernetes.container.name": "app",
                              "io.cri-containerd.kind": "container"}
    assert c.image == "127.0.0.1:5000/busybox:latest"
    assert c.created_at.ToNanoseconds() == 1_700_000_000_123_456_789
    assert c.spec.value == b"{}" and c.sandbox == "s" * 64


def test_a_label_cannot_pose_as_the_other_kind() -> None:
    sb = Sandbox(id="s" * 64, config=pb.PodSandboxConfig(
        labels={"io.cri-containerd.kind": "container"}), handler="runc", runtime_handler="",
        created_at=1)
    assert view.of_sandbox(sb, "", b"{}").labels["io.cri-containerd.kind"] == "sandbox"
    c = _container()
    c.config.labels["io.cri-containerd.kind"] = "sandbox"
    assert view.of_container(c, "", b"{}").labels["io.cri-containerd.kind"] == "container"


@pytest.mark.parametrize(("state", "pid", "status"), [
    (pb.CONTAINER_UNKNOWN, 0, None),  # being created: not yet a task
    (pb.CONTAINER_CREATED, 42, ctrd.CREATED),
    (pb.CONTAINER_RUNNING, 42, ctrd.RUNNING),
    (pb.CONTAINER_EXITED, 42, ctrd.STOPPED),
])
def test_container_task_states(state: int, pid: int, status: int | None) -> None:
    c = _container(state=state, pid=pid, exit_code=-1 if state == pb.CONTAINER_EXITED else 0,
                   finished_at=5)
    if status is None:
        with pytest.raises(NotFound):
            view.container_task(c)
        return
    task = view.container_task(c)
    assert (task.pid, task.status) == (pid, status)
    p = view.process(c.id, task)
    assert p.id == p.container_id == c.id
    if status == ctrd.STOPPED:
        assert p.exit_status == 0xFFFFFFFF and p.exited_at.ToNanoseconds() == 5

