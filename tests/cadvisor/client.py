"""A client that sends exactly what cAdvisor's containerd plugin sends: the three
unary calls by their containerd method paths, with the `containerd-namespace: k8s.io`
header its interceptor adds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2

from pycri.cadvisor.api import containerd_pb2 as ctrd

CONTAINERS_GET = "/containerd.services.containers.v1.Containers/Get"
TASKS_GET = "/containerd.services.tasks.v1.Tasks/Get"
VERSION = "/containerd.services.version.v1.Version/Version"
K8S = (("containerd-namespace", "k8s.io"),)


class CadvisorClient:
    def __init__(self, sock: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix://{sock}")

    def call(self, method: str, request: Any, response: Any,
             metadata: tuple[tuple[str, str], ...] | None = K8S) -> Any:  # fmt: skip
        fn = self.channel.unary_unary(method, request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=response.FromString)
        return fn(request, metadata=metadata, timeout=10)

    def container(self, oid: str) -> ctrd.Container:
        return self.call(CONTAINERS_GET, ctrd.GetContainerRequest(id=oid),
                         ctrd.GetContainerResponse).container

    def task(self, oid: str) -> ctrd.Process:
        return self.call(TASKS_GET, ctrd.GetTaskRequest(container_id=oid),
                         ctrd.GetTaskResponse).process

    def version(self) -> str:
        return str(self.call(VERSION, empty_pb2.Empty(), ctrd.VersionResponse,
                             metadata=None).version)

    def close(self) -> None:
        self.channel.close()
