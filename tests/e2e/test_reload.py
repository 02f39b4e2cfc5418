"""SIGHUP reloads the config file into a running daemon: all or nothing, one log line,
running pods and containers untouched (pycri/reload.py, Daemon.reload)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import secrets
import signal
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node, conflist
from tests.e2e.test_cdi import spec as cdi_spec
from tests.e2e.test_nri_lifecycle import _is_zombie, install_recorder
from tests.e2e.test_operator import _free_port, _listening_ports
from tests.lib import images
from tests.lib.nri_plugin import PluginThread
from tests.lib.registry import Registry


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
    assert "log_format: must be one of text, json" in line, line
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


SLEEP = ["sleep", "3600"]


def _nri(text: str, *lines: str) -> str:
    """The config `text` with `lines` added to its [nri] table."""
    return text.replace("[nri]\n", "[nri]\n" + "".join(f"{x}\n" for x in lines), 1)


def _records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _wait(pred: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_sighup_reloads_nri_and_running_pods_never_notice(node: Node) -> None:
    """Timeouts apply to the next call with every plugin staying; a socket path held by
    another process refuses the reload; a moved socket keeps connected plugins;
    disable_connections drops the socket's plugins and keeps the pre-installed one;
    enable = false stops NRI, enable = true starts it with what runs."""
    log = install_recorder(node)
    node.restart()
    base = node.proc.config.read_text()
    sid, pod = node.run_pod("nri-before")
    cid = node.run(sid, pod, "sleeper", SLEEP)
    started = node.status(cid).started_at
    pid = _records(log)[0]["pid"]

    def preinstalled_saw(pod_id: str) -> bool:
        return any(r["method"] == "RunPodSandbox" and r["request"]["pod"]["id"] == pod_id
                   for r in _records(log))

    old_socket, moved = Path(node.nri_socket), node.tmp / "nri2" / "nri.sock"
    with PluginThread("ext", "60") as ext, PluginThread("late", "70") as late:
        ext.connect(node.nri_socket)
        ext.wait_for("Synchronize")
        line = _reload(node, _nri(base, "request_timeout = 0.5"), "config reloaded: ")
        assert line.endswith("config reloaded: nri.request_timeout"), line
        assert ext.is_connected()

        # A new socket path someone else serves: refused, the old socket still serves.
        moved.parent.mkdir()
        squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        squatter.bind(str(moved))
        squatter.listen()
        text = _nri(base.replace(str(old_socket), str(moved)), "request_timeout = 0.5")
        try:
            line = _reload(node, text, "config reload refused")
        finally:
            squatter.close()
        assert f"nri.socket_path: cannot listen on {moved}" in line, line
        assert old_socket.exists()
        moved.unlink()

        line = _reload(node, text, "config reloaded: ")
        assert line.endswith("config reloaded: nri.socket_path"), line
        assert not old_socket.exists()
        assert stat.S_IMODE(os.stat(moved).st_mode) == 0o600
        assert ext.is_connected()  # connected through the old socket, still there
        sid2, _ = node.run_pod("nri-moved")
        ext.wait_for("RunPodSandbox", lambda r: r.pod.id == sid2)
        late.connect(str(moved))
        synced = late.wait_for("Synchronize")
        assert {sid, sid2} <= {p.id for p in synced.pods}

        # The reloaded request timeout (0.5 s, not the 2 s before) ends a slow plugin.
        ext.plugin.delays["RunPodSandbox"] = 1.5
        sid3, _ = node.run_pod("nri-slow")
        ext.wait_closed()
        assert node.pod_status(sid3).state == pb.SANDBOX_READY

        # disable_connections: the socket goes and its plugins with it; not the
        # pre-installed one.
        line = _reload(node, _nri(text, "disable_connections = true"), "config reloaded: ")
        assert line.endswith("config reloaded: nri.disable_connections"), line
        late.wait_closed()
        assert not moved.exists()
        sid4, _ = node.run_pod("nri-closed")
        _wait(lambda: preinstalled_saw(sid4), "the pre-installed plugin missed a pod")
        assert {r["pid"] for r in _records(log)} == {pid}

    # enable = false: every plugin shut down, the pre-installed process gone.
    line = _reload(node, _nri(base, "enable = false"), "config reloaded: ")
    assert "nri.enable" in line, line
    _wait(lambda: not os.path.exists(f"/proc/{pid}") or _is_zombie(pid),
          "the pre-installed plugin still runs")
    assert not old_socket.exists()
    sid5, _ = node.run_pod("nri-off")
    # enable = true again: started as at start-up, synchronized with what runs now.
    line = _reload(node, base, "config reloaded: ")
    assert line.endswith("config reloaded: nri.enable"), line
    assert old_socket.exists()
    _wait(lambda: len({r["pid"] for r in _records(log)}) == 2, "not started again")
    sync = [r for r in _records(log) if r["method"] == "Synchronize"][-1]
    assert {sid, sid5} <= {p["id"] for p in sync["request"]["pods"]}
    assert not preinstalled_saw(sid5)
    # What ran before any of this runs on.
    assert node.pod_status(sid).state == pb.SANDBOX_READY
    st = node.status(cid)
    assert st.state == pb.CONTAINER_RUNNING and st.started_at == started


def test_sighup_reloads_cdi_dirs_and_checkpoint_settings(node: Node) -> None:
    base = node.proc.config.read_text()
    sid, pod = node.run_pod("cdi-reload")
    dev = [pb.CDIDevice(name="pycri.test/null=null")]
    with pytest.raises(grpc.RpcError) as exc:
        node.create(sid, pod, "before", SLEEP, CDI_devices=dev)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    cid = node.run(sid, pod, "sleeper", SLEEP)
    # Asked once with the node's criu: its probe's answer is cached...
    archives = node.tmp / "archives"
    first = pb.CheckpointContainerRequest(container_id=cid, location=str(archives / "1.tar"))
    with contextlib.suppress(grpc.RpcError):  # FailedPrecondition where that criu can't work
        node.cri.runtime.CheckpointContainer(first)

    spec_dir, missing = node.tmp / "cdi-reloaded", node.tmp / "no-criu"
    spec_dir.mkdir()
    (node.tmp / "cdi-data").mkdir()
    (spec_dir / "null.json").write_text(json.dumps(cdi_spec(node.tmp / "cdi-data")))
    other_criu = re.sub(r'(?m)^criu = .*$', f'criu = "{missing}"', base)
    line = _reload(node, f'{other_criu}[cdi]\nspec_dirs = ["{spec_dir}"]\n', "config reloaded: ")
    assert line.endswith("config reloaded: cdi.spec_dirs, checkpoint.criu"), line
    # ...and asked again after the reload, with the new binary.
    second = pb.CheckpointContainerRequest(container_id=cid, location=str(archives / "2.tar"))
    with pytest.raises(grpc.RpcError) as exc:
        node.cri.runtime.CheckpointContainer(second)
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"the criu binary {missing} is not there" in (exc.value.details() or "")
    # The next create finds the device in the reloaded spec dir.
    with_dev = node.run(sid, pod, "after", SLEEP, CDI_devices=dev)
    assert node.exec(with_dev, "test", "-c", "/dev/cdi-null").exit_code == 0
    assert node.status(cid).state == pb.CONTAINER_RUNNING


def _manifest_gets(reg: Registry, repo: str) -> int:
    pat = re.compile(rf'"GET /v2/{re.escape(repo)}/manifests/')
    return len(pat.findall(reg.log_path.read_text(errors="replace")))


def test_sighup_switches_the_next_pull_to_a_mirror(node: Node, registry: Registry,
                                                   tmp_path: Path) -> None:
    """The Done-when of issue 13: a SIGHUP that points [images] registries_conf at a
    file with a mirror makes the next pull fetch from the mirror, and the pod running
    since before is not touched."""
    mirror = Registry(tmp_path / "mirror").start()
    try:
        origin, _, rest = node.image.partition("/")
        name, _, tag = rest.rpartition(":")
        assert images.push_busybox(mirror.addr, tmp_path / "mirror-layout", name, tag) == \
            f"{mirror.addr}/{rest}"
        sid, pod = node.run_pod("mirror-before")
        cid = node.run(sid, pod, "sleeper", SLEEP)
        started = node.status(cid).started_at
        pull = pb.PullImageRequest(image=pb.ImageSpec(image=node.image))
        node.cri.image.PullImage(pull)
        assert _manifest_gets(mirror, name) == 0
        from_origin = _manifest_gets(registry, name)
        assert from_origin > 0

        conf = node.tmp / "mirrored-registries.conf"
        conf.write_text(f'[[registry]]\nprefix = "{origin}"\nlocation = "{origin}"\n'
                        f'[[registry.mirror]]\nlocation = "{mirror.addr}"\n')
        base = node.proc.config.read_text()
        text = re.sub(r'registries_conf = ".*"', f'registries_conf = "{conf}"', base)
        line = _reload(node, text, "config reloaded: ")
        assert line.endswith("config reloaded: images.registries_conf"), line
        node.cri.image.PullImage(pull)
        assert _manifest_gets(mirror, name) > 0
        assert _manifest_gets(registry, name) == from_origin
        st = node.status(cid)
        assert st.state == pb.CONTAINER_RUNNING and st.started_at == started
        assert node.pod_status(sid).state == pb.SANDBOX_READY
    finally:
        mirror.stop()
