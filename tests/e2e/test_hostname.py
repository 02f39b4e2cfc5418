"""Pod hostnames in every form an unmodified kubelet sends (issue 25): a pod that asks for
one starts, and `hostname` and `hostname -f` in its container print what was meant."""

from __future__ import annotations

import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

# What the kubelet builds: a pod name (a DNS subdomain, so dots are allowed) or
# spec.hostname, cut to 63; with setHostnameAsFQDN `<hostname>.<subdomain>.<namespace>.svc.
# <cluster domain>`, at most 64 characters and ending in '.' when the cluster domain is
# empty (pkg/kubelet/util GetNodenameForKernel).
KUBELET_HOSTNAMES = [
    "web-0",
    "web.v1-2.x",
    "h" * 63,
    "0" * 64,
    "web-0.sub.e2e.svc.cluster.local",
    "web-0.sub.e2e.svc.",
    "a" * 39 + ".sub.ns.svc.cluster.local",
    "0" * 52 + ".sub.ns.svc.",
]


@pytest.mark.parametrize("hostname", KUBELET_HOSTNAMES)
def test_kubelet_hostname_is_set_and_resolves(node: Node, hostname: str) -> None:
    sid, pod = node.run_pod("fqdn", hostname=hostname)
    assert node.pod_status(sid).state == pb.SANDBOX_READY
    cid = node.run(sid, pod, "c", ["sleep", "300"])
    short = node.exec(cid, "hostname")
    full = node.exec(cid, "hostname", "-f")
    assert (short.exit_code, short.stdout.decode()) == (0, hostname + "\n")
    assert (full.exit_code, full.stdout.decode()) == (0, hostname + "\n"), full.stderr
    hosts = node.exec(cid, "cat", "/etc/hosts").stdout.decode()
    ip = node.pod_status(sid).network.ip
    assert f"{ip}\t{hostname}" in hosts


def test_kubelet_fqdn_is_refused_where_the_kernel_cannot_take_it(node: Node) -> None:
    """65 characters: sethostname(2) refuses it, so the gate does, before any work."""
    fqdn = "a" * 40 + ".sub.ns.svc.cluster.local"
    cfg = node.pod_config("long", hostname=fqdn)
    with pytest.raises(Exception) as err:
        node.cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg))
    assert "config.hostname: longer than 64" in str(err.value)
    assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
