"""SIGHUP reloads the config file into a running daemon: all or nothing, one log line,
running pods and containers untouched (pycri/reload.py, Daemon.reload)."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node, conflist
from tests.e2e.test_operator import _free_port, _listening_ports


def _reload(node: Node, text: str, expect: str) -> str:
    """Write the config, SIGHUP the daemon, return the reload's log line."""
    assert node.proc.proc is not None
    start = len(node.proc.log_text())
    node.proc.config.write_text(text)
    os.kill(node.proc.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        found = [line for line in node.proc.log_text()[start:].splitlines()
                 if "config reload" in line]
        if found:
            assert len(found) == 1, found
            assert expect in found[0], found
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no reload line in the log:\n{node.proc.log_text()[start:]}")


def _serves(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
            return b"pycri_pods" in resp.read()
    except (urllib.error.URLError, ConnectionError):
        return False


@pytest.fixture
def bridge(node: Node) -> Iterator[str]:
    """A second bridge for the reloaded network, deleted afterwards."""
    name = f"{node.bridge}r"[:15]
    yield name
    node.remove_all()  # its pods first, so the plugins' DEL finds the bridge
    nat = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True)
    subprocess.run(["ip", "link", "del", name], capture_output=True)
    assert f"e2e-{name}" not in nat.stdout


def test_sighup_applies_a_good_file_and_refuses_a_bad_one(node: Node, bridge: str) -> None:
    base = node.proc.config.read_text()
    first = f"127.0.0.1:{_free_port()}"
    node.proc.config.write_text(f'metrics_address = "{first}"\n{base}')
    node.restart()
    assert _serves(first)
    sid, pod = node.run_pod("before")
    cid = node.run(sid, pod, "sleeper", ["sleep", "300"])
    started = node.status(cid).started_at

    # A bad value and a key that needs a restart are refused; nothing changes.
    line = _reload(node, f'log_format = "yaml"\nmetrics_address = "127.0.0.1:1"\n{base}',
                   "config reload refused")
    assert "log_format: 'yaml' is not one of" in line, line
    line = _reload(node, f'cgroup_driver = "systemd"\n{base}', "config reload refused")
    assert "cgroup_driver: cannot change without a restart" in line, line
    assert _serves(first)

    # A good one: a new metrics address, default runtime and handler, registries file.
    second = f"127.0.0.1:{_free_port()}"
    blocked = node.tmp / "blocked-registries.conf"
    blocked.write_text(f'[[registry]]\nlocation = "{node.image.split("/")[0]}"\n'
                       "blocked = true\n")
    images = re.sub(r'registries_conf = ".*"', f'registries_conf = "{blocked}"', base)
    # Another network (bridge, subnet) from another conf dir: new pods get its IPs.
    net_d = node.tmp / "net2.d"
    net_d.mkdir()
    subnet = f"10.197.{secrets.randbelow(250)}.0/24"
    (net_d / "10-e2e.conflist").write_text(conflist(bridge, subnet, node.tmp / "ipam2", []))
    images = re.sub(r'^conf_dir = ".*"', f'conf_dir = "{net_d}"', images, flags=re.M)
    line = _reload(node, f'metrics_address = "{second}"\ndefault_runtime = "crun"\n'
                   f'log_format = "json"\n{images}[runtimes.extra]\npath = "/usr/bin/crun"\n',
                   "config reloaded: ")
    entry = json.loads(line)  # the new format already applies to the reload's own line
    assert entry["level"] == "info" and entry["msg"] == (
        "config reloaded: cni.conf_dir, default_runtime, images.registries_conf, log_format, "
        "metrics_address, runtimes.extra"), entry
    assert _serves(second) and not _serves(first)
    assert node.proc.proc is not None
    assert int(first.rsplit(":", 1)[1]) not in _listening_ports(node.proc.proc.pid)

    # The next pull reads the new registries file: the registry is blocked now.
    with pytest.raises(grpc.RpcError) as exc:
        node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=node.image)))
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "blocked" in (exc.value.details() or "")
    # The new handlers are offered, and a new pod gets the new default runtime.
    status = node.cri.runtime.Status(pb.StatusRequest())
    assert "extra" in [h.name for h in status.runtime_handlers]
    sid2, _ = node.run_pod("after")
    assert (node.tmp / "state" / "crun" / sid2).is_dir()
    new_ip = node.pod_status(sid2).network.ip
    assert ipaddress.ip_address(new_ip) in ipaddress.ip_network(subnet), (new_ip, subnet)
    old_ip = node.pod_status(sid).network.ip
    assert ipaddress.ip_address(old_ip) in ipaddress.ip_network(node.subnet), old_ip
    # What ran before the reload runs on, under its old runtime, and still stops.
    assert node.pod_status(sid).state == pb.SANDBOX_READY
    st = node.status(cid)
    assert st.state == pb.CONTAINER_RUNNING and st.started_at == started
    assert (node.tmp / "state" / "runc" / cid).is_dir()
    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1))
    assert node.status(cid).state == pb.CONTAINER_EXITED
