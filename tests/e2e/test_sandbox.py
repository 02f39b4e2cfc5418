"""Pod sandboxes end to end: real netns, real CNI plugins, real conmon + runc/crun."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node, conflist
from tests.lib import images
from tests.lib.registry import Registry
from tests.network.helpers import purge_nat_rules

pytestmark = pytest.mark.e2e


def chain_test_plugin(node: Node, name: str, script: str) -> Path:
    """Install `script` as CNI plugin `name`, chained after the node's bridge+portmap,
    and restart the node on that network; returns the plugin's path."""
    bindir = node.tmp / "cni-bin"
    bindir.mkdir(exist_ok=True)
    plugin = bindir / name
    plugin.write_text(script)
    plugin.chmod(0o755)
    (node.tmp / "net.d" / "10-e2e.conflist").write_text(
        conflist(node.bridge, node.subnet, node.tmp / "ipam", [{"type": name}]))
    cfg = node.proc.config
    cfg.write_text(cfg.read_text().replace(
        "[cni]\n", f'[cni]\nbin_dirs = ["{bindir}", "/usr/lib/cni"]\n'))
    node.restart()
    return plugin


def host_local_leases(node: Node) -> list[str]:
    d = node.tmp / "ipam"
    return [p.name for p in d.rglob("*") if p.name[0].isdigit()] if d.exists() else []


def test_run_status_list_stop_remove(node: Node) -> None:
    sid, cfg = node.run_pod("basic", labels={"app": "x"}, annotations={"a": "b"})
    st = node.pod_status(sid)
    assert st.state == pb.SANDBOX_READY
    assert st.metadata == cfg.metadata
    assert st.network.ip.startswith(node.subnet.rsplit(".", 2)[0])
    assert dict(st.labels) == {"app": "x"} and dict(st.annotations) == {"a": "b"}
    assert time.time_ns() - st.created_at < 60 * 10**9
    verbose = node.cri.runtime.PodSandboxStatus(
        pb.PodSandboxStatusRequest(pod_sandbox_id=sid, verbose=True)
    )
    info = json.loads(verbose.info["info"])
    assert Path(info["netnsPath"]).exists()
    assert Path(f"/proc/{info['pid']}").exists()
    assert info["runtimeSpec"]["process"]["args"] == ["/catatonit", "-P"]
    # List by unique prefix, by state and by label.
    lst = node.cri.runtime.ListPodSandbox
    assert [p.id for p in lst(pb.ListPodSandboxRequest(
        filter=pb.PodSandboxFilter(id=sid[:12]))).items] == [sid]
    assert [p.id for p in lst(pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(
        label_selector={"app": "x"}))).items] == [sid]
    assert not lst(pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(
        label_selector={"app": "y"}))).items
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    st = node.pod_status(sid)
    assert st.state == pb.SANDBOX_NOTREADY
    assert not Path(info["netnsPath"]).exists()
    assert not Path(f"/proc/{info['pid']}").exists()
    assert host_local_leases(node) == []
    ready = pb.PodSandboxFilter(state=pb.PodSandboxStateValue(state=pb.SANDBOX_READY))
    assert not lst(pb.ListPodSandboxRequest(filter=ready)).items
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    assert not lst(pb.ListPodSandboxRequest()).items


def test_idempotence_and_not_found(node: Node) -> None:
    rt = node.cri.runtime
    sid, _ = node.run_pod("idem")
    for _ in range(2):
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    for _ in range(2):
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id="0" * 64))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id="0" * 64))
    with pytest.raises(grpc.RpcError) as e:
        node.pod_status(sid)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_name_reserved_while_the_first_exists(node: Node) -> None:
    sid, cfg = node.run_pod("dup")
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg))
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert sid in (e.value.details() or "")
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    sid2, _ = node.run_pod("dup")  # free again once removed
    assert sid2 != sid


def test_bad_requests_change_nothing(node: Node) -> None:
    rt = node.cri.runtime
    with pytest.raises(grpc.RpcError) as e:
        rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pb.PodSandboxConfig()))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        rt.RunPodSandbox(pb.RunPodSandboxRequest(
            config=node.pod_config("h"), runtime_handler="kata"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "kata" in (e.value.details() or "")
    assert not rt.ListPodSandbox(pb.ListPodSandboxRequest()).items


def test_two_pods_reach_each_other(node: Node) -> None:
    a, pa = node.run_pod("a")
    b, _ = node.run_pod("b")
    ip_a, ip_b = node.pod_status(a).network.ip, node.pod_status(b).network.ip
    assert ip_a != ip_b
    ca = node.run(a, pa, "pinger", ["sleep", "1000"])
    r = node.exec(ca, "ping", "-c", "1", "-W", "3", ip_b)
    assert r.exit_code == 0, r.stderr


def test_host_port_reaches_the_pod(node: Node) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        host_port = s.getsockname()[1]
    sid, pod = node.run_pod("web", port_mappings=[
        pb.PortMapping(protocol=pb.TCP, container_port=8080, host_port=host_port)])
    serve = "while true; do echo hello-from-pod | nc -l -p 8080; done"
    node.run(sid, pod, "srv", ["sh", "-c", serve])
    gateway = node.subnet.rsplit(".", 1)[0] + ".1"
    deadline = time.monotonic() + 10
    data = b""
    while time.monotonic() < deadline and b"hello-from-pod" not in data:
        try:
            with socket.create_connection((gateway, host_port), timeout=2) as c:
                data = c.recv(100)
        except OSError:
            time.sleep(0.2)
    assert b"hello-from-pod" in data


def test_host_network_pod_sees_host_interfaces(node: Node) -> None:
    ns = pb.NamespaceOption(network=pb.NODE)
    sid, pod = node.run_pod("hostnet", linux=pb.LinuxPodSandboxConfig(
        security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns)))
    assert node.pod_status(sid).network.ip == ""
    cid = node.run(sid, pod, "c", ["sleep", "1000"], linux=pb.LinuxContainerConfig(
        security_context=pb.LinuxContainerSecurityContext(namespace_options=ns)))
    r = node.exec(cid, "cat", "/proc/net/dev")
    host = Path("/proc/net/dev").read_text()
    host_ifaces = {line.split(":")[0].strip() for line in host.splitlines()[2:]}
    pod_ifaces = {line.split(":")[0].strip() for line in r.stdout.decode().splitlines()[2:]}
    assert pod_ifaces == host_ifaces


def test_shared_pid_namespace_sees_infra_as_pid1(node: Node) -> None:
    ns = pb.NamespaceOption(pid=pb.POD)
    sid, pod = node.run_pod("sharedpid", linux=pb.LinuxPodSandboxConfig(
        security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns)))
    cid = node.run(sid, pod, "c", ["sleep", "1000"], linux=pb.LinuxContainerConfig(
        security_context=pb.LinuxContainerSecurityContext(namespace_options=ns)))
    r = node.exec(cid, "cat", "/proc/1/cmdline")
    assert r.stdout.split(b"\0")[0] == b"/catatonit"
    # Container PID mode: the container is PID 1 of its own namespace.
    own = pb.NamespaceOption(pid=pb.CONTAINER)
    cid2 = node.run(sid, pod, "own", ["sleep", "1000"], linux=pb.LinuxContainerConfig(
        security_context=pb.LinuxContainerSecurityContext(namespace_options=own)))
    assert node.exec(cid2, "cat", "/proc/1/cmdline").stdout.split(b"\0")[0] == b"sleep"


def test_failing_cni_plugin_leaves_nothing(node: Node) -> None:
    plugin = chain_test_plugin(
        node, "failer",
        '#!/bin/sh\necho \'{"cniVersion":"1.0.0","code":7,"msg":"boom"}\'\nexit 1\n',
    )
    with pytest.raises(grpc.RpcError) as e:
        node.run_pod("doomed")
    assert "boom" in (e.value.details() or "")
    assert "failer" in (e.value.details() or "")
    assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
    # The only sandbox id there was is gone with everything named after it.
    assert not list((node.tmp / "root" / "sandboxes").glob("*"))
    assert not any(f"pycri-{p.name}" in os.listdir("/run/netns")
                   for p in (node.tmp / "root" / "cni-cache").glob("*"))
    assert host_local_leases(node) == []
    assert not list((node.tmp / "state" / "bundles").glob("*"))
    assert subprocess.run(["pgrep", "-f", f"conmon.*{node.tmp}"], capture_output=True).stdout == b""
    # The plugin failed its DEL too, so its cached state waits for a retry; once the
    # plugin works again, the next start releases it.
    cache = node.tmp / "root" / "cni-cache"
    assert [p.name for p in cache.iterdir()]
    plugin.write_text('#!/bin/sh\n[ "$CNI_COMMAND" = DEL ] && exit 0\nexit 1\n')
    node.restart()
    assert not [p for p in cache.iterdir() if any(p.iterdir())]


def test_network_not_ready_without_config(node: Node) -> None:
    (node.tmp / "net.d" / "10-e2e.conflist").unlink()
    conds = {c.type: c for c in node.cri.runtime.Status(pb.StatusRequest()).status.conditions}
    assert conds["NetworkReady"].status is False
    assert conds["NetworkReady"].reason == "NetworkPluginNotReady"
    with pytest.raises(grpc.RpcError):
        node.run_pod("nonet")
    (node.tmp / "net.d" / "10-e2e.conflist").write_text(
        conflist(node.bridge, node.subnet, node.tmp / "ipam", []))
    conds = {c.type: c for c in node.cri.runtime.Status(pb.StatusRequest()).status.conditions}
    assert conds["NetworkReady"].status is True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_restart_keeps_pods(node: Node, sig: int) -> None:
    sid, pod = node.run_pod("survivor")
    cid = node.run(sid, pod, "c", ["sleep", "1000"])
    before = node.pod_status(sid)
    node.restart(sig)
    after = node.pod_status(sid)
    assert after.state == pb.SANDBOX_READY
    assert after.network.ip == before.network.ip
    assert node.status(cid).state == pb.CONTAINER_RUNNING
    assert node.exec(cid, "true").exit_code == 0
    with pytest.raises(grpc.RpcError) as e:
        node.run_pod("survivor")  # the name stays reserved across the restart
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_reboot_pods_come_back_notready_and_clean_up(node: Node) -> None:
    sid, pod = node.run_pod("rebooted")
    cid = node.run(sid, pod, "c", ["sleep", "1000"])
    cpid = int((node.tmp / "state" / "bundles" / cid / "monitor" / "pidfile").read_text())
    cmon = int((node.tmp / "state" / "bundles" / cid / "monitor" / "conmon.pid").read_text())
    info = json.loads(node.cri.runtime.PodSandboxStatus(
        pb.PodSandboxStatusRequest(pod_sandbox_id=sid, verbose=True)).info["info"])
    node.cri.channel.close()
    node.proc.kill()
    # Simulate a reboot: processes, netns, NAT rules and the state dir are gone; the CNI
    # cache (on the root dir) is not.
    for pid in (cpid, cmon, info["pid"], info["conmonPid"]):
        os.kill(pid, signal.SIGKILL)
    for pid in (cpid, info["pid"]):
        while Path(f"/proc/{pid}").exists():
            time.sleep(0.02)
    for oid in (sid, cid):  # a reboot takes the cgroups with it
        for d in Path("/sys/fs/cgroup").glob(f"*/pycri/{oid}"):
            d.rmdir()
    subprocess.run(["umount", "-l", info["netnsPath"]], check=True)
    os.unlink(info["netnsPath"])
    mounts = Path("/proc/mounts").read_text().splitlines()
    for m in [ln.split()[1] for ln in mounts if str(node.tmp / "state") in ln]:
        subprocess.run(["umount", "-l", m], check=True)
    subprocess.run(["rm", "-rf", str(node.tmp / "state")], check=True)
    purge_nat_rules(sid)
    node.start()
    assert node.pod_status(sid).state == pb.SANDBOX_NOTREADY
    st = node.cri.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=cid)).status
    assert (st.state, st.reason) == (pb.CONTAINER_EXITED, "Unknown")
    assert host_local_leases(node) != []  # still held until StopPodSandbox
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    assert host_local_leases(node) == []
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))


def test_twenty_pods_concurrently_without_leaks(node: Node) -> None:

    def run(i: int) -> str:
        return node.run_pod(f"many-{i}")[0]

    with ThreadPoolExecutor(10) as pool:
        ids = list(pool.map(run, range(20)))
    ips = {node.pod_status(sid).network.ip for sid in ids}
    assert len(ips) == 20 and "" not in ips
    assert len(host_local_leases(node)) == 20

    def remove(sid: str) -> None:
        node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
        node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))

    with ThreadPoolExecutor(10) as pool:
        list(pool.map(remove, ids))
    assert not [n for n in os.listdir("/run/netns") if n.removeprefix("pycri-") in ids]
    assert host_local_leases(node) == []
    assert not list((node.tmp / "state" / "bundles").glob("*"))


def test_configured_pause_image_is_pulled_pinned_and_run(
    node: Node, registry: Registry, tmp_path: Path
) -> None:
    pause = images.push_busybox(registry.addr, tmp_path / "layout", name="pause", tag="e2e",
                                entrypoint=["/bin/sleep"], cmd=["1000000"])
    cfg = node.proc.config
    cfg.write_text(f'pause_image = "{pause}"\n' + cfg.read_text())
    node.restart()
    sid, _ = node.run_pod("paused")
    info = json.loads(node.cri.runtime.PodSandboxStatus(
        pb.PodSandboxStatusRequest(pod_sandbox_id=sid, verbose=True)).info["info"])
    # `runc start` returns before runc init has exec'd the entrypoint: wait for it.
    cmdline = Path(f"/proc/{info['pid']}/cmdline")
    deadline = time.monotonic() + 30
    while cmdline.read_bytes().split(b"\0")[1:2] == [b"init"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cmdline.read_bytes().split(b"\0")[:2] == [b"/bin/sleep", b"1000000"]
    img = node.cri.image.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=pause)))
    assert img.image.pinned
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    assert not list((node.tmp / "root" / "snapshots").glob("*"))


def test_container_of_host_network_pod_needs_no_options(node: Node) -> None:
    host = pb.NamespaceOption(network=pb.NODE)
    sid, pod = node.run_pod("hostnet2", linux=pb.LinuxPodSandboxConfig(
        security_context=pb.LinuxSandboxSecurityContext(namespace_options=host)))
    cid = node.run(sid, pod, "c", ["sleep", "1000"])  # no namespace options at all
    netns = Path(f"/proc/{os.getpid()}/ns/net").readlink()
    pid = int((node.tmp / "state" / "bundles" / cid / "monitor" / "pidfile").read_text())
    assert Path(f"/proc/{pid}/ns/net").readlink() == netns


def test_crash_in_the_middle_of_run_pod_sandbox_leaks_nothing(node: Node) -> None:
    marker = node.tmp / "plugin-running"
    chain_test_plugin(
        node, "stall",
        "#!/usr/bin/env python3\n"
        "import json, os, sys, time\n"
        "conf = json.load(sys.stdin)\n"
        "if os.environ['CNI_COMMAND'] == 'ADD':\n"
        f"    open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(60)\n"
        "print(json.dumps(conf.get('prevResult') or {'cniVersion': conf['cniVersion']}))\n",
    )
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(node.run_pod, "crashy")
        deadline = time.monotonic() + 20
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline, "the stalling plugin never ran"
            time.sleep(0.05)
        node.proc.kill()  # kill -9 pycri while CNI ADD is half-way
        os.kill(int(marker.read_text()), signal.SIGKILL)
        with pytest.raises(grpc.RpcError):
            pending.result(timeout=30)
    assert host_local_leases(node) != []  # the bridge plugin had already leased an IP
    node.start()
    pods = node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
    assert [(p.metadata.name, p.state) for p in pods] == [("crashy", pb.SANDBOX_NOTREADY)]
    sid = pods[0].id
    assert Path(f"/run/netns/pycri-{sid}").exists()
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    assert host_local_leases(node) == []
    assert not Path(f"/run/netns/pycri-{sid}").exists()
    assert not list((node.tmp / "root" / "sandboxes").glob("*"))


def test_a_client_that_gives_up_does_not_leave_a_half_stopped_pod(node: Node) -> None:
    chain_test_plugin(
        node, "slowdel",
        "#!/usr/bin/env python3\n"
        "import json, os, sys, time\n"
        "conf = json.load(sys.stdin)\n"
        "if os.environ['CNI_COMMAND'] == 'DEL':\n"
        "    time.sleep(1.5)\n"
        "print(json.dumps(conf.get('prevResult') or {'cniVersion': conf['cniVersion']}))\n",
    )
    sid, _ = node.run_pod("impatient")
    netns = Path(f"/run/netns/pycri-{sid}")
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid),
                                        timeout=0.3)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 10
    while netns.exists():  # the daemon finishes the stop on its own
        assert time.monotonic() < deadline, "the abandoned StopPodSandbox never finished"
        time.sleep(0.1)
    assert node.pod_status(sid).state == pb.SANDBOX_NOTREADY
    assert host_local_leases(node) == []
    assert not [r for r in subprocess.run(["iptables-save", "-t", "nat"], capture_output=True,
                                          text=True).stdout.splitlines() if sid in r]


def test_pod_status_carries_its_containers_statuses_and_a_timestamp(node: Node) -> None:
    """What the kubelet's evented PLEG reads from PodSandboxStatus: the statuses of the
    pod's containers (the same as ContainerStatus answers) as of `timestamp` (ns)."""
    sid, cfg = node.run_pod("pod-with-statuses")
    other_sid, other_cfg = node.run_pod("other-pod")
    running = node.run(sid, cfg, "running", ["sleep", "3600"])
    created = node.create(sid, cfg, "created", ["true"])
    node.create(other_sid, other_cfg, "elsewhere", ["true"])
    before = time.time_ns()
    resp = node.cri.runtime.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=sid))
    assert before <= resp.timestamp <= time.time_ns()
    got = {s.id: s for s in resp.containers_statuses}
    assert set(got) == {running, created}
    assert got[running].state == pb.CONTAINER_RUNNING
    assert got[created].state == pb.CONTAINER_CREATED
    assert got[running] == node.status(running)
