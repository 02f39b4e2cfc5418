"""The CRI wire contract: committed stubs are current and match runtime.v1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parent.parent


def test_stubs_are_current(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(REPO / "hack/gen-proto.sh"), str(tmp_path)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        cwd=REPO,
    )
    for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
        fresh = (tmp_path / name).read_text()
        committed = (REPO / "pycri/api" / name).read_text()
        assert fresh == committed, f"pycri/api/{name} is stale: run hack/gen-proto.sh"


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
