"""sandbox/network.py: the CNI arguments built from a pod's record, directly."""

from __future__ import annotations

import pytest

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.network import DNS, Bandwidth, PortMapping
from pycri.sandbox.network import parse_bandwidth, pod_network
from pycri.store.sandbox import Sandbox


def sandbox(config: pb.PodSandboxConfig, **kw: object) -> Sandbox:
    return Sandbox(id="s1", config=config, handler="runc", runtime_handler="",
                   created_at=1, **kw)  # type: ignore[arg-type]


def test_cni_args_ports_bandwidth_and_dns() -> None:
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="web", namespace="ns", uid="u-1"),
        port_mappings=[
            pb.PortMapping(protocol=pb.UDP, container_port=53, host_port=5353,
                           host_ip="127.0.0.1"),
            pb.PortMapping(protocol=pb.SCTP, container_port=9, host_port=9009),
            pb.PortMapping(protocol=pb.TCP, container_port=80),  # nothing to publish
        ],
        annotations={"kubernetes.io/ingress-bandwidth": "10M",
                     "kubernetes.io/egress-bandwidth": "1Gi"},
        dns_config=pb.DNSConfig(servers=["10.0.0.10"], searches=["ns.svc"],
                                options=["ndots:5"]),
    )
    net = pod_network(sandbox(cfg, netns="/run/netns/pycri-s1", cgroup_parent="/pycri/pod-s1"))
    assert (net.sandbox_id, net.netns, net.name, net.namespace, net.uid) == (
        "s1", "/run/netns/pycri-s1", "web", "ns", "u-1")
    assert net.port_mappings == (PortMapping("udp", 53, 5353, "127.0.0.1"),
                                 PortMapping("sctp", 9, 9009))
    assert net.bandwidth == Bandwidth(ingress=10_000_000, egress=2**30)
    assert net.dns == DNS(("10.0.0.10",), ("ns.svc",), ("ndots:5",))
    assert net.cgroup_path == "/pycri/pod-s1"


def test_no_capabilities_asked_for_are_none() -> None:
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", namespace="n"))
    net = pod_network(sandbox(cfg))
    assert (net.port_mappings, net.bandwidth, net.dns) == ((), None, None)


def test_one_direction_of_bandwidth_leaves_the_other_unlimited() -> None:
    cfg = pb.PodSandboxConfig(annotations={"kubernetes.io/egress-bandwidth": "512k"})
    assert pod_network(sandbox(cfg)).bandwidth == Bandwidth(ingress=None, egress=512_000)


@pytest.mark.parametrize(("value", "bps"), [
    ("10M", 10**7), ("1Gi", 2**30), ("1.5k", 1500), (" 100 ", 100), ("2Ki", 2048)])
def test_bandwidth_quantities(value: str, bps: int) -> None:
    assert parse_bandwidth(value) == bps


@pytest.mark.parametrize("value", ["", "10 M", "-1M", "1e6", "10MB", "fast"])
def test_a_bandwidth_that_is_no_quantity_is_invalid(value: str) -> None:
    with pytest.raises(InvalidArgument, match="is not a quantity"):
        parse_bandwidth(value)


def test_a_bad_annotation_fails_the_arguments() -> None:
    cfg = pb.PodSandboxConfig(annotations={"kubernetes.io/ingress-bandwidth": "lots"})
    with pytest.raises(InvalidArgument):
        pod_network(sandbox(cfg))
