"""Config selection, default network, stdin/runtimeConfig building, status: no plugins run."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from pycri.errors import FailedPrecondition, InvalidArgument
from pycri.network import DNS, Bandwidth, CNIManager, NetworkResult, PodNetwork, PortMapping
from pycri.network.cni import NOT_READY_REASON, cni_args, plugin_stdin, runtime_config
from pycri.network.conf import DEFAULT_TEMPLATE, default_network, find_network, from_json

BRIDGE = {"type": "bridge", "bridge": "b0", "ipam": {"type": "host-local"}}


def write(d: Path, name: str, data: object) -> Path:
    p = d / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def conflist(name: str, *types: str) -> dict[str, object]:
    return {"cniVersion": "1.0.0", "name": name, "plugins": [{"type": t} for t in types]}


def test_lexically_first_file_wins_and_conf_is_wrapped(tmp_path: Path) -> None:
    write(tmp_path, "20-b.conflist", conflist("b", "bridge"))
    write(tmp_path, "10-a.conf", {"cniVersion": "0.4.0", "name": "a", **BRIDGE})
    write(tmp_path, "05-ignored.txt", conflist("txt", "bridge"))
    net = find_network(tmp_path)
    assert net is not None
    assert (net.name, net.cni_version, net.source) == ("a", "0.4.0", str(tmp_path / "10-a.conf"))
    assert net.plugins == (BRIDGE,)
    assert net.to_json() == {"cniVersion": "0.4.0", "name": "a", "plugins": [BRIDGE]}


def test_json_extension_accepts_a_list(tmp_path: Path) -> None:
    write(tmp_path, "a.json", conflist("j", "bridge", "portmap"))
    net = find_network(tmp_path)
    assert net is not None and [p["type"] for p in net.plugins] == ["bridge", "portmap"]


@pytest.mark.parametrize(
    "bad",
    [
        "{not json",
        [],
        {"name": "x", "plugins": []},
        {"name": "bad name!", "plugins": [{"type": "bridge"}]},
        {"name": "x", "plugins": [{"type": "../../bin/sh"}]},
        {"name": "x", "plugins": [{"bridge": "no type"}]},
        {"name": "x", "cniVersion": "one", "plugins": [{"type": "bridge"}]},
        {"name": "x", "plugins": [{"type": "bridge", "capabilities": []}]},
    ],
)
def test_invalid_files_are_skipped_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: object
) -> None:
    write(tmp_path, "00-bad.conflist", bad)
    write(tmp_path, "99-good.conflist", conflist("good", "bridge"))
    with caplog.at_level(logging.WARNING, logger="pycri.network.conf"):
        net = find_network(tmp_path)
    assert net is not None and net.name == "good"
    assert any("00-bad.conflist" in r.getMessage() for r in caplog.records)


def test_missing_or_empty_dir_has_no_network(tmp_path: Path) -> None:
    assert find_network(tmp_path / "absent") is None
    assert find_network(tmp_path) is None


def test_default_network_renders_placeholders(tmp_path: Path) -> None:
    net = default_network(DEFAULT_TEMPLATE, "10.85.0.0/16", "pycri0", str(tmp_path))
    bridge = net.plugins[0]
    assert bridge["bridge"] == "pycri0" and bridge["isGateway"] and bridge["ipMasq"]
    assert bridge["hairpinMode"] is True
    assert bridge["ipam"] == {
        "type": "host-local",
        "ranges": [[{"subnet": "10.85.0.0/16"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": str(tmp_path),
    }
    assert [p["type"] for p in net.plugins] == ["bridge", "portmap", "bandwidth"]
    assert net.plugins[1]["capabilities"] == {"portMappings": True}
    assert "@" not in json.dumps(net.to_json())
    v6 = default_network(DEFAULT_TEMPLATE, "fd00:85::/64", "br6")
    assert v6.plugins[0]["ipam"]["routes"] == [{"dst": "::/0"}]
    assert "dataDir" not in v6.plugins[0]["ipam"]


@pytest.mark.parametrize("subnet,bridge", [("10.85.0.0/33", "b"), ("x", "b"),
                                           ("10.0.0.0/8", ""), ("10.0.0.0/8", "a" * 16)])
def test_default_network_rejects_bad_values(subnet: str, bridge: str) -> None:
    with pytest.raises(ValueError):
        default_network(DEFAULT_TEMPLATE, subnet, bridge)


POD = PodNetwork(
    sandbox_id="abc123", netns="/run/netns/x", name="web", namespace="prod", uid="u-1",
    port_mappings=(PortMapping("TCP", 80, 8080, "127.0.0.1"), PortMapping("udp", 53, 0)),
    bandwidth=Bandwidth(ingress=1_000_000), dns=DNS(servers=("10.0.0.10",), searches=("a.b",)),
    cgroup_path="/kubepods/pod-u-1", ips=("10.85.0.9",),
)


def test_cni_args_and_runtime_config() -> None:
    assert cni_args(POD) == ("IgnoreUnknown=1;K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web;"
                             "K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=u-1")
    assert runtime_config(POD) == {
        # hostPort 0 is not a host mapping
        "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp",
                          "hostIP": "127.0.0.1"}],
        "bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 2**31 - 1},
        "dns": {"servers": ["10.0.0.10"], "searches": ["a.b"], "options": []},
        "ips": ["10.85.0.9"],
        "cgroupPath": "/kubepods/pod-u-1",
    }
    bare = PodNetwork("id", "/n", "p", "ns", "u", bandwidth=Bandwidth(), dns=DNS())
    assert runtime_config(bare) == {}


def test_plugin_stdin_grants_only_declared_capabilities() -> None:
    net = from_json(conflist("n", "bridge"), "t")
    rc = runtime_config(POD)
    plugin = {"type": "portmap", "capabilities": {"portMappings": True, "bandwidth": False},
              "runtimeConfig": {"keep": 1}}
    prev = {"cniVersion": "1.0.0", "ips": []}
    stdin = plugin_stdin(net, plugin, rc, prev)
    assert stdin["name"] == "n" and stdin["cniVersion"] == "1.0.0"
    assert stdin["runtimeConfig"] == {"keep": 1, "portMappings": rc["portMappings"]}
    assert stdin["prevResult"] is prev
    assert "runtimeConfig" not in plugin_stdin(net, {"type": "bridge"}, rc, None)
    assert "prevResult" not in plugin_stdin(net, {"type": "bridge"}, rc, None)


def test_result_ips_v4_first_and_pod_side_only() -> None:
    raw = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "br"}, {"name": "eth0", "sandbox": "/run/netns/x"}],
        "ips": [
            {"interface": 1, "address": "fd00::5/64"},
            {"interface": 0, "address": "10.0.0.1/24"},  # the bridge's gateway address
            {"interface": 1, "address": "10.0.0.5/24"},
        ],
    }
    res = NetworkResult.from_cni(raw)
    assert res.ips == ("10.0.0.5", "fd00::5") and res.primary_ip == "10.0.0.5"
    old = NetworkResult.from_cni({"cniVersion": "0.2.0", "ip4": {"ip": "10.1.0.3/16"}})
    assert old.ips == ("10.1.0.3",)
    assert NetworkResult.from_cni({"cniVersion": "1.0.0"}).primary_ip == ""


def manager(tmp_path: Path, **kw: object) -> CNIManager:
    conf = tmp_path / "net.d"
    conf.mkdir(exist_ok=True)
    return CNIManager(conf, ["/usr/lib/cni"], tmp_path / "cache", **kw)  # type: ignore[arg-type]


def test_status_not_ready_without_config_then_reloads(tmp_path: Path) -> None:
    m = manager(tmp_path, default_network=False)
    st = m.status()
    assert not st.ready and st.reason == NOT_READY_REASON and "no valid CNI" in st.message
    write(tmp_path / "net.d", "50-x.conflist", conflist("x", "bridge", "portmap"))
    assert m.status() == (True, "", "")
    net = m.network()
    assert net is not None and net.name == "x"
    # A lexically earlier file takes over on the next call.
    write(tmp_path / "net.d", "10-y.conflist", conflist("y", "bridge"))
    net = m.network()
    assert net is not None and net.name == "y"
    # An in-place rewrite is noticed too (size changes).
    write(tmp_path / "net.d", "10-y.conflist", conflist("yy", "bridge"))
    net = m.network()
    assert net is not None and net.name == "yy"
    for p in (tmp_path / "net.d").iterdir():
        p.unlink()
    assert not m.status().ready


def test_status_not_ready_when_a_plugin_binary_is_missing(tmp_path: Path) -> None:
    m = manager(tmp_path, default_network=False)
    write(tmp_path / "net.d", "a.conflist", conflist("x", "bridge", "no-such-plugin"))
    st = m.status()
    assert not st.ready and st.reason == NOT_READY_REASON
    assert "no-such-plugin" in st.message and "/usr/lib/cni" in st.message


def test_default_network_used_when_dir_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    m = manager(tmp_path, default_network=True, default_subnet="10.77.0.0/16",
                default_bridge="pcritst")
    with caplog.at_level(logging.INFO, logger="pycri.network.cni"):
        assert m.status().ready
    net = m.network()
    assert net is not None and net.source == "<default>"
    assert net.plugins[0]["bridge"] == "pcritst"
    assert any("default network" in r.getMessage() for r in caplog.records)
    write(tmp_path / "net.d", "a.conflist", conflist("mine", "bridge"))
    net = m.network()
    assert net is not None and net.name == "mine"


def test_bad_default_template_is_not_ready(tmp_path: Path) -> None:
    m = manager(tmp_path, default_template=tmp_path / "missing.conflist")
    st = m.status()
    assert not st.ready and "default network unusable" in st.message


@pytest.mark.parametrize(
    "change",
    [
        {"sandbox_id": "../escape"},
        {"netns": "relative/path"},
        {"name": "a;b"},
        {"uid": "x=y"},
        {"namespace": "a\x00b"},
        {"ifname": "a" * 16},
        {"port_mappings": (PortMapping("icmp", 1, 1),)},
        {"port_mappings": (PortMapping("tcp", 0, 80),)},
        {"port_mappings": (PortMapping("tcp", 80, 70000),)},
        {"port_mappings": (PortMapping("tcp", 80, 80, "not-an-ip"),)},
        {"ips": ("300.1.1.1",)},
    ],
)
async def test_bad_pod_input_changes_nothing(tmp_path: Path, change: dict[str, Any]) -> None:
    m = manager(tmp_path, default_network=False)
    write(tmp_path / "net.d", "a.conflist", conflist("x", "bridge"))
    pod = dataclasses.replace(POD, **change)
    with pytest.raises(InvalidArgument):
        await m.setup(pod)
    assert not (tmp_path / "cache").exists() or not os.listdir(tmp_path / "cache")


async def test_setup_refused_when_not_ready(tmp_path: Path) -> None:
    m = manager(tmp_path, default_network=False)
    with pytest.raises(FailedPrecondition, match="no valid CNI"):
        await m.setup(POD)
    # Nothing was ever set up: teardown is a no-op success.
    await m.teardown(POD)
