"""oci/spec/namespaces.py: the namespaces a container joins or creates; hostname and sysctls."""

from __future__ import annotations

from typing import Any

import pytest

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument

from .specutil import build, container_config


def ns_of(spec: dict[str, Any]) -> dict[str, str | None]:
    return {n["type"]: n.get("path") for n in spec["linux"]["namespaces"]}


def ns_spec(
    network: pb.NamespaceMode = pb.POD,
    pid: pb.NamespaceMode = pb.POD,
    ipc: pb.NamespaceMode = pb.POD,
    **ctx: Any,
) -> dict[str, Any]:
    cfg = container_config()
    o = cfg.linux.security_context.namespace_options
    o.network, o.pid, o.ipc = network, pid, ipc
    return build(cfg, **ctx)


def test_pod_namespaces_joined() -> None:
    assert ns_of(ns_spec()) == {
        "mount": None,
        "network": "/run/netns/pod",
        "uts": "/proc/10/ns/uts",
        "ipc": "/proc/10/ns/ipc",
        "pid": "/proc/10/ns/pid",
    }


def test_host_namespaces_omitted_and_no_hostname() -> None:
    s = ns_spec(network=pb.NODE, pid=pb.NODE, ipc=pb.NODE)
    assert ns_of(s) == {"mount": None}
    assert "hostname" not in s
    assert ns_spec()["hostname"] == "podhost"


def test_container_pid_and_target() -> None:
    assert ns_of(ns_spec(pid=pb.CONTAINER))["pid"] is None
    assert "pid" in ns_of(ns_spec(pid=pb.CONTAINER))
    s = ns_spec(pid=pb.TARGET, pid_ns="/proc/77/ns/pid")
    assert ns_of(s)["pid"] == "/proc/77/ns/pid"
    with pytest.raises(InvalidArgument, match="target"):
        ns_spec(pid=pb.TARGET, pid_ns=None)


def test_missing_pod_namespace_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="network"):
        ns_spec(net_ns=None)


def test_sysctls_from_sandbox() -> None:
    assert build()["linux"]["sysctl"] == {"net.ipv4.ip_unprivileged_port_start": "0"}
