"""The pod's CNI arguments: what RunPodSandbox's ADD and StopPodSandbox's DEL pass
to the plugins (CNI_ARGS, port mappings, bandwidth and DNS capabilities)."""

from __future__ import annotations

import re

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.network import DNS, Bandwidth, PodNetwork, PortMapping
from pycri.store.sandbox import Sandbox

PROTOCOLS = {pb.TCP: "tcp", pb.UDP: "udp", pb.SCTP: "sctp"}
INGRESS_ANNOTATION = "kubernetes.io/ingress-bandwidth"
EGRESS_ANNOTATION = "kubernetes.io/egress-bandwidth"
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|K|M|G|T)?$")
_SCALE = {
    None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}  # fmt: skip


def parse_bandwidth(value: str) -> int:
    """A Kubernetes quantity ("10M", "1Gi") in bits per second."""
    m = _QUANTITY.match(value.strip())
    if not m:
        raise InvalidArgument(f"bandwidth {value!r} is not a quantity like 10M")
    return int(float(m.group(1)) * _SCALE[m.group(2)])


def pod_network(sb: Sandbox) -> PodNetwork:
    """The CNI arguments of a pod, from its record: the same for its ADD and its DEL."""
    config = sb.config
    md = config.metadata
    bw_in = config.annotations.get(INGRESS_ANNOTATION)
    bw_out = config.annotations.get(EGRESS_ANNOTATION)
    bandwidth = None
    if bw_in or bw_out:
        bandwidth = Bandwidth(
            ingress=parse_bandwidth(bw_in) if bw_in else None,
            egress=parse_bandwidth(bw_out) if bw_out else None,
        )
    dns = config.dns_config
    return PodNetwork(
        sandbox_id=sb.id,
        netns=sb.netns,
        name=md.name,
        namespace=md.namespace,
        uid=md.uid,
        port_mappings=tuple(
            PortMapping(
                protocol=PROTOCOLS.get(p.protocol, "tcp"),
                container_port=p.container_port,
                host_port=p.host_port,
                host_ip=p.host_ip,
            )
            for p in config.port_mappings
            if p.host_port > 0
        ),
        bandwidth=bandwidth,
        dns=DNS(tuple(dns.servers), tuple(dns.searches), tuple(dns.options))
        if (dns.servers or dns.searches or dns.options)
        else None,
        cgroup_path=sb.cgroup_parent,
    )
