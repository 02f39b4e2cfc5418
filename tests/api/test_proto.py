"""The CRI wire contract: committed stubs are current and match runtime.v1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[2]


def test_stubs_are_current(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(REPO / "hack/gen-proto.sh"), str(tmp_path / "cri"), str(tmp_path / "nri"),
         str(tmp_path / "cadvisor")],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        cwd=REPO,
    )
    stubs = [("cri", "pycri/api", n) for n in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py",
                                                "pulls_pb2.py", "pulls_pb2.pyi",
                                                "pulls_pb2_grpc.py")]
    stubs += [("nri", "pycri/nri/api", n) for n in ("api_pb2.py", "api_pb2.pyi")]
    stubs += [("cadvisor", "pycri/cadvisor/api", n)
              for n in ("containerd_pb2.py", "containerd_pb2.pyi")]
    for fresh_dir, committed_dir, name in stubs:
        fresh = (tmp_path / fresh_dir / name).read_text()
        committed = (REPO / committed_dir / name).read_text()
        assert fresh == committed, f"{committed_dir}/{name} is stale: run hack/gen-proto.sh"


def test_package_and_services() -> None:
    assert pb.DESCRIPTOR.package == "runtime.v1"
    services = pb.DESCRIPTOR.services_by_name
    assert set(services) == {"RuntimeService", "ImageService"}
    assert len(services["ImageService"].methods) == 6
    assert "RunPodSandbox" in services["RuntimeService"].methods_by_name
    assert hasattr(pb_grpc, "add_RuntimeServiceServicer_to_server")


def test_field_numbers_that_the_kubelet_depends_on() -> None:
    # Spot checks against k8s.io/cri-api runtime/v1: a wrong number breaks the wire silently.
    fields = pb.ContainerConfig.DESCRIPTOR.fields_by_name
    assert fields["metadata"].number == 1
    assert fields["image"].number == 2
    assert fields["log_path"].number == 11
    assert fields["linux"].number == 15
    status = pb.ContainerStatus.DESCRIPTOR.fields_by_name
    assert status["exit_code"].number == 7
    assert status["log_path"].number == 15
    assert pb.PodSandboxConfig.DESCRIPTOR.fields_by_name["port_mappings"].number == 5
    assert pb.ContainerState.Value("CONTAINER_EXITED") == 2
    assert pb.NamespaceMode.Value("TARGET") == 3
    assert pb.MountPropagation.Value("PROPAGATION_BIDIRECTIONAL") == 2


def test_nri_package_and_services() -> None:
    # containerd/nri pkg/api: the service and method names plugins dial by.
    from pycri.nri.api import api_pb2 as nri

    assert nri.DESCRIPTOR.package == "nri.pkg.api.v1alpha1"
    services = nri.DESCRIPTOR.services_by_name
    assert {"Runtime", "Plugin"} <= set(services)
    assert "RegisterPlugin" in services["Runtime"].methods_by_name
    assert "Synchronize" in services["Plugin"].methods_by_name
    assert nri.Event.Value("CREATE_CONTAINER") == 4


def test_containerd_field_numbers_that_cadvisor_reads() -> None:
    # containerd/api containers.v1, tasks.v1, version.v1 and types/task, as cAdvisor's
    # containerd plugin decodes them: a wrong number is a silently empty answer.
    from pycri.cadvisor.api import containerd_pb2 as ctrd

    container = ctrd.Container.DESCRIPTOR.fields_by_name
    assert {n: container[n].number for n in ("id", "labels", "image", "runtime", "spec",
                                              "created_at", "sandbox")} == {
        "id": 1, "labels": 2, "image": 3, "runtime": 4, "spec": 5, "created_at": 8,
        "sandbox": 11}
    assert ctrd.GetContainerRequest.DESCRIPTOR.fields_by_name["id"].number == 1
    assert ctrd.GetTaskRequest.DESCRIPTOR.fields_by_name["exec_id"].number == 2
    process = ctrd.Process.DESCRIPTOR.fields_by_name
    assert {n: process[n].number for n in ("pid", "status", "exit_status", "exited_at")} == {
        "pid": 3, "status": 4, "exit_status": 9, "exited_at": 10}
    assert (ctrd.UNKNOWN, ctrd.CREATED, ctrd.RUNNING, ctrd.STOPPED) == (0, 1, 2, 3)
    assert ctrd.VersionResponse.DESCRIPTOR.fields_by_name["version"].number == 1
