"""Requests as an unmodified kubelet builds them, at the limits of the gate's rules
(issue 25; the comparison is in docs/cri-fields.md, "What the gate refuses"): each
starts a pod and a container that see what was meant. Hostnames in every form, with
`hostname` and `hostname -f` printing them; and what a kubelet on cgroup v2, a namespace
with many Services and any string the API took make of a pod."""

from __future__ import annotations

from pathlib import Path

import grpc
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


def test_kubelet_pod_on_cgroup_v2_with_service_links_and_any_argument(node: Node) -> None:
    """A kubelet >= 1.32 on cgroup v2 asks for memory.oom.group on the pod and its
    containers; enableServiceLinks gives 7 env vars per Service (1,500 Services: 10,500);
    args and annotation values hold any character but NUL."""
    unified = {"memory.oom.group": "1"}
    sid, pod = node.run_pod(
        "v2", annotations={"note": "bell\x07 and \x1b[1mbold\x1b[0m"},
        linux=pb.LinuxPodSandboxConfig(
            resources=pb.LinuxContainerResources(cpu_shares=2, unified=unified),
            overhead=pb.LinuxContainerResources(unified=unified)))
    assert node.pod_status(sid).state == pb.SANDBOX_READY
    envs = [pb.KeyValue(key=f"SVC_{i}_SERVICE_HOST", value=b"10.96.0.1") for i in range(10_500)]
    cid = node.run(sid, pod, "c", ["sh", "-c", 'printf "%s" "$1" > /tmp/arg; sleep 300', "sh",
                                   "tab\there\x0cff\x1b"], envs=envs)
    assert node.exec(cid, "cat", "/tmp/arg").stdout == b"tab\there\x0cff\x1b"
    seen = node.exec(cid, "sh", "-c", "echo $SVC_10499_SERVICE_HOST; env | grep -c ^SVC_")
    assert seen.stdout.decode().split() == ["10.96.0.1", "10500"]


def test_memory_limit_the_api_allows_runs_and_one_runc_cannot_start_in_is_refused(
        node: Node) -> None:
    """`memory: 4Mi` is a valid pod: it runs (the 12 MiB floor refused it). 1 MiB is
    below what runc needs to set up the container: InvalidArgument, nothing left."""
    sid, pod = node.run_pod("small")
    small = pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
        memory_limit_in_bytes=4 << 20))
    cid = node.run(sid, pod, "c", ["sleep", "300"], linux=small)
    assert node.exec(cid, "echo", "ok").stdout == b"ok\n"
    tiny = pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
        memory_limit_in_bytes=1 << 20))
    with pytest.raises(grpc.RpcError) as err:
        node.create(sid, pod, "tiny", ["sleep", "300"], linux=tiny)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    listed = node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers
    assert [c.id for c in listed] == [cid]


def test_mount_and_working_dir_with_dot_dot_as_the_pod_spec_has_them(
        node: Node, tmp_path: Path) -> None:
    """The kubelet passes an absolute mountPath and workingDir as written; `..` cannot
    climb above the container's `/`, and pycri uses them normalised."""
    (tmp_path / "vol").mkdir()
    (tmp_path / "vol" / "f").write_text("from the host\n")
    sid, pod = node.run_pod("dots")
    cid = node.run(sid, pod, "c", ["sleep", "300"], working_dir="/srv/./app/..",
                   mounts=[pb.Mount(container_path="/data/../cache",
                                    host_path=str(tmp_path / "vol"))])
    assert node.exec(cid, "cat", "/cache/f").stdout == b"from the host\n"
    assert node.exec(cid, "pwd").stdout == b"/srv\n"
