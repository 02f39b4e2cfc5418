"""Real CNI: Debian's bridge/host-local/portmap/loopback plugins, real netns, real iptables."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time

import pytest

from pycri.errors import FailedPrecondition
from pycri.network import CNIPluginError, PortMapping, list_netns, remove_netns
from tests.network.helpers import (
    TAG,
    NetEnv,
    host_links,
    in_netns,
    nat_rules_with,
    netns_links,
    run,
)

BUSYBOX = "/usr/bin/busybox"
PORTMAP = {"type": "portmap", "capabilities": {"portMappings": True}}


def veths(bridge: str) -> set[str]:
    """Host-side veths on the test's own bridge (other runs' veths never count)."""
    out = run("ip", "-o", "link", "show", "master", bridge, check=False)
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


async def test_two_pods_distinct_ips_reach_each_other(netenv: NetEnv) -> None:
    netenv.write_conf("10-test.conflist", netenv.conflist())
    m = netenv.manager()
    assert m.status().ready
    veths_before = veths(netenv.bridge)
    a, b = await netenv.pod(), await netenv.pod()
    ra, rb = await m.setup(a), await m.setup(b)
    assert ra.primary_ip != rb.primary_ip
    assert all(ip.startswith(netenv.subnet.rsplit(".", 1)[0]) for ip in ra.ips + rb.ips)
    assert netenv.leases() == sorted([ra.primary_ip, rb.primary_ip])
    assert ra.raw["cniVersion"] == "1.0.0"
    # loopback plugin brought lo up; eth0 exists in the pod.
    assert {"lo", "eth0"} <= netns_links(a.netns)
    assert "UP" in in_netns(a.netns, "ip", "link", "show", "lo").stdout
    ping = in_netns(a.netns, BUSYBOX, "ping", "-c", "1", "-W", "3", rb.primary_ip)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    # ipMasq rules carry the sandbox id in their comment.
    assert nat_rules_with(a.sandbox_id)
    await m.teardown(a)
    await m.teardown(b)
    assert netenv.leases() == []
    assert netenv.cached() == []
    assert veths(netenv.bridge) == veths_before
    assert netns_links(a.netns) == {"lo"}
    assert nat_rules_with(netenv.prefix) == []


async def test_host_port_reaches_pod_listener(netenv: NetEnv) -> None:
    netenv.write_conf("10-test.conflist", netenv.conflist([PORTMAP]))
    m = netenv.manager()
    port = 20000 + int(TAG, 16) % 20000
    pod = await netenv.pod(port_mappings=(PortMapping("TCP", 8080, port),))
    res = await m.setup(pod)
    assert any(f"--dport {port}" in r for r in nat_rules_with(f"{res.primary_ip}:8080"))
    # One-shot listeners in the pod netns answer with a marker line.
    for target in (netenv.gateway, "127.0.0.1"):
        server = subprocess.Popen(
            ["nsenter", f"--net={pod.netns}", BUSYBOX, "sh", "-c",
             f"echo hello-{TAG} | {BUSYBOX} nc -l -p 8080"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            data = await asyncio.to_thread(_read_from, target, port)
        finally:
            server.kill()
            server.wait()
        assert data.strip() == f"hello-{TAG}", target
    await m.teardown(pod)
    assert nat_rules_with(pod.sandbox_id) == []
    assert nat_rules_with(f"--dport {port} ") == []


def _read_from(host: str, port: int) -> str:
    """Connect (retrying while the listener starts) and read until EOF."""
    last: Exception | None = None
    for _ in range(50):
        try:
            with socket.create_connection((host, port), timeout=3) as s:
                chunks = []
                while chunk := s.recv(4096):
                    chunks.append(chunk)
                if chunks:
                    return b"".join(chunks).decode()
        except OSError as e:
            last = e
        time.sleep(0.1)
    raise AssertionError(f"no answer from {host}:{port}: {last}")


async def test_failing_plugin_rolls_back(netenv: NetEnv) -> None:
    failer = netenv.script_plugin("failer", fail_on="ADD")
    netenv.write_conf("10-test.conflist", netenv.conflist([PORTMAP, {"type": failer}]))
    m = netenv.manager()
    pod = await netenv.pod(port_mappings=(PortMapping("tcp", 80, 31999),))
    veths_before = veths(netenv.bridge)
    with pytest.raises(CNIPluginError) as ei:
        await m.setup(pod)
    err = ei.value
    assert (err.plugin, err.command, err.code, err.msg) == ("failer", "ADD", 7, "injected failure")
    assert "failer" in str(err) and "by the test" in str(err)
    assert netenv.leases() == []
    assert netns_links(pod.netns) == {"lo"}  # no eth0 left in the pod
    assert veths(netenv.bridge) == veths_before
    assert netenv.cached() == []
    assert nat_rules_with(pod.sandbox_id) == []
    # With the failure gone the same sandbox sets up cleanly (no "duplicate allocation").
    netenv.allow(failer)
    res = await m.setup(pod)
    assert netenv.leases() == [res.primary_ip]
    await m.teardown(pod)
    assert netenv.leases() == []


async def test_teardown_after_restart_and_conf_change(netenv: NetEnv) -> None:
    netenv.write_conf("10-test.conflist", netenv.conflist([PORTMAP]))
    pod = await netenv.pod(port_mappings=(PortMapping("tcp", 80, 31998),))
    res = await netenv.manager().setup(pod)
    assert netenv.leases() == [res.primary_ip]
    assert nat_rules_with(pod.sandbox_id)
    # "Restart": a new manager, the conf dir emptied, no default network.
    (netenv.conf_dir / "10-test.conflist").unlink()
    fresh = netenv.manager()
    assert not fresh.status().ready
    assert fresh.cache.sandboxes() == [pod.sandbox_id]  # what a startup GC would find
    await fresh.teardown(pod)
    assert fresh.cache.sandboxes() == []
    assert netenv.leases() == []
    assert nat_rules_with(pod.sandbox_id) == []
    assert netns_links(pod.netns) == {"lo"}
    await fresh.teardown(pod)  # twice: still success


async def test_teardown_when_netns_is_gone(netenv: NetEnv) -> None:
    """After a reboot the pinned netns no longer exists; the lease must still go."""
    netenv.write_conf("10-test.conflist", netenv.conflist())
    m = netenv.manager()
    pod = await netenv.pod()
    res = await m.setup(pod)
    await remove_netns(pod.netns)
    assert netenv.leases() == [res.primary_ip]
    await m.teardown(pod)
    assert netenv.leases() == []
    assert netenv.cached() == []


async def test_failed_del_keeps_cache_for_retry(netenv: NetEnv) -> None:
    stuck = netenv.script_plugin("stuck", fail_on="DEL")
    netenv.write_conf("10-test.conflist", netenv.conflist([{"type": stuck}]))
    m = netenv.manager()
    pod = await netenv.pod()
    res = await m.setup(pod)
    with pytest.raises(CNIPluginError, match="stuck"):
        await m.teardown(pod)
    assert f"{pod.sandbox_id}/testnet.json" in netenv.cached()
    # DEL goes on past the broken plugin: the bridge still released the lease.
    assert res.primary_ip and netenv.leases() == []
    netenv.allow(stuck)
    await m.teardown(pod)
    assert netenv.leases() == [] and netenv.cached() == []


async def test_double_setup_is_refused(netenv: NetEnv) -> None:
    netenv.write_conf("10-test.conflist", netenv.conflist())
    m = netenv.manager()
    pod = await netenv.pod()
    res = await m.setup(pod)
    with pytest.raises(FailedPrecondition, match="already has CNI state"):
        await m.setup(pod)
    assert netenv.leases() == [res.primary_ip]
    await m.teardown(pod)


async def test_twenty_concurrent_pods(netenv: NetEnv) -> None:
    netenv.write_conf("10-test.conflist", netenv.conflist([PORTMAP]))
    m = netenv.manager()
    netns_before = [n for n in list_netns() if TAG in n]
    veths_before = veths(netenv.bridge)
    pods = [await netenv.pod() for _ in range(20)]
    results = await asyncio.gather(*(m.setup(p) for p in pods))
    ips = [r.primary_ip for r in results]
    assert len(set(ips)) == 20
    assert netenv.leases() == sorted(ips)
    assert len(veths(netenv.bridge) - veths_before) == 20
    await asyncio.gather(*(m.teardown(p) for p in pods))
    for p in pods:
        await remove_netns(p.netns)
    assert netenv.leases() == []
    assert netenv.cached() == []
    assert veths(netenv.bridge) == veths_before
    assert [n for n in list_netns() if TAG in n] == netns_before
    assert nat_rules_with(netenv.prefix) == []


async def test_default_network_end_to_end(netenv: NetEnv) -> None:
    """The shipped template, rendered with this test's bridge and subnet, really works."""
    m = netenv.manager(default_network=True, default_subnet=netenv.subnet,
                       default_bridge=netenv.bridge, default_ipam_data_dir=str(netenv.data_dir))
    assert m.status().ready
    pod = await netenv.pod()
    res = await m.setup(pod)
    cached = json.loads((netenv.cache_dir / pod.sandbox_id / "pycri.json").read_text())
    assert [p["type"] for p in cached["config"]["plugins"]] == ["bridge", "portmap", "bandwidth"]
    assert cached["result"] == res.raw
    assert netenv.bridge in host_links()
    await m.teardown(pod)
    assert netenv.leases() == []


async def test_unreadable_result_is_undone(netenv: NetEnv) -> None:
    """A last plugin whose result has a bogus address: setup fails and leaves nothing."""
    bogus = netenv.bin_dir / "bogus"
    bogus.write_text(
        "#!/usr/bin/python3\n"
        "import json, os, sys\n"
        "conf = json.load(sys.stdin)\n"
        "if os.environ['CNI_COMMAND'] == 'ADD':\n"
        "    r = conf['prevResult']\n"
        "    r['ips'].append({'address': 'not-an-ip'})\n"
        "    print(json.dumps(r))\n"
    )
    bogus.chmod(0o755)
    netenv.write_conf("10-test.conflist", netenv.conflist([{"type": "bogus"}]))
    m = netenv.manager()
    pod = await netenv.pod()
    with pytest.raises(CNIPluginError, match=r"bogus.*unreadable result"):
        await m.setup(pod)
    assert netenv.leases() == [] and netenv.cached() == []
    assert netns_links(pod.netns) == {"lo"}
