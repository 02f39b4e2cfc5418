"""NRI lifecycle against a live pycri: the test plugin (tests/lib/nri_plugin.py, the
plugin side of the protocol over pycri's own wire code) on the node's NRI socket.

Event order and metadata, plugin order, a failing hook undone with nothing left and a
retry with the same name, what is visible while a hook runs, a hanging plugin
disconnected while the RPC goes on, a plugin whose connection dies mid-call,
Synchronize with what exists (also across a restart, and racing a create).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from pycri.api import api_pb2 as pb
from pycri.nri.api import api_pb2 as api
from pycri.nri.ttrpc import TTRPCError
from tests.conftest import REPO
from tests.e2e.conftest import Node, leftovers
from tests.e2e.test_sandbox import host_local_leases
from tests.lib.nri_plugin import PluginThread

pytestmark = pytest.mark.e2e

SLEEP = ["sleep", "3600"]


@pytest.fixture
def plugins(node: Node) -> Iterator[Callable[..., PluginThread]]:
    """Connects test plugins to the node (synchronized before returning); all closed after."""
    made: list[PluginThread] = []

    def connect(name: str = "test", idx: str = "50", *, sync: bool = True,
                setup: Callable[[PluginThread], None] | None = None, **kw: Any) -> PluginThread:
        p = PluginThread(name, idx, **kw)
        made.append(p)
        if setup is not None:
            setup(p)
        p.connect(node.nri_socket)
        if sync:
            p.wait_for("Synchronize")
        return p

    yield connect
    for p in made:
        p.close()


def _for(events: list[tuple[str, Any]], oid: str) -> list[str]:
    """The methods that concern pod or container `oid`, in order."""
    out = []
    for method, req in events:
        ids = set()
        if hasattr(req, "pod"):
            ids.add(req.pod.id)
        if hasattr(req, "container") and req.HasField("container"):
            ids.add(req.container.id)
        if oid in ids:
            out.append(method)
    return out


def test_socket_is_root_only(node: Node) -> None:
    st = os.stat(node.nri_socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0


def test_events_in_lifecycle_order_with_metadata(node: Node, plugins: Callable[..., PluginThread]
                                                 ) -> None:
    p = plugins()
    config = p.plugin.config
    assert config is not None and config.runtime_name == "pycri"
    assert (config.registration_timeout, config.request_timeout) == (5000, 2000)

    sid, pod = node.run_pod("nri-order", labels={"app": "a"}, annotations={"k": "v"})
    ip = node.pod_status(sid).network.ip
    cid = node.create(sid, pod, "c1", ["sh", "-c", "echo hi; sleep 3600"],
                      envs=[pb.KeyValue(key="E", value=b"1")], labels={"l": "1"})
    node.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=cid))
    node.cri.runtime.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
        container_id=cid, linux=pb.LinuxContainerResources(cpu_shares=512)))
    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=1))
    node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))  # again
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    p.wait_for("RemovePodSandbox")

    events = p.events()
    assert _for(events, sid) == [
        "RunPodSandbox", "CreateContainer", "PostCreateContainer", "StartContainer",
        "PostStartContainer", "UpdateContainer", "PostUpdateContainer", "StopContainer",
        "RemoveContainer", "StopPodSandbox", "RemovePodSandbox"]
    by = {m: r for m, r in events if m in ("RunPodSandbox", "CreateContainer",
                                            "PostStartContainer", "UpdateContainer",
                                            "StopContainer")}
    run = by["RunPodSandbox"].pod
    assert (run.id, run.name, run.namespace, run.uid) == (sid, "nri-order", "e2e",
                                                         "uid-nri-order")
    assert dict(run.labels) == {"app": "a"} and run.annotations["k"] == "v"
    assert run.runtime_handler == "runc" and run.pid > 0
    assert list(run.ips) == [ip]
    created = by["CreateContainer"].container
    assert (created.id, created.pod_sandbox_id, created.name) == (cid, sid, "c1")
    assert created.state == api.CONTAINER_CREATED and dict(created.labels) == {"l": "1"}
    assert list(created.args) == ["sh", "-c", "echo hi; sleep 3600"]
    assert "E=1" in created.env
    assert any(m.destination == "/etc/hostname" for m in created.mounts)
    assert created.linux.cgroups_path and created.image.config_digest.startswith("sha256:")
    started = by["PostStartContainer"].container
    assert started.state == api.CONTAINER_RUNNING and started.pid > 0
    assert by["UpdateContainer"].linux_resources.cpu.shares.value == 512
    stopped = by["StopContainer"].container
    assert stopped.state == api.CONTAINER_STOPPED and stopped.finished_at > 0


def test_a_container_exiting_by_itself_is_reported_stopped(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    p = plugins(events=["StopContainer", "RemoveContainer"])
    sid, pod = node.run_pod("nri-exit")
    cid = node.run(sid, pod, "fails", ["sh", "-c", "exit 3"])
    stop = p.wait_for("StopContainer", lambda r: r.container.id == cid)
    assert stop.container.exit_code == 3 and stop.container.state == api.CONTAINER_STOPPED
    node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
    assert _for(p.events(), cid) == ["StopContainer", "RemoveContainer"]


def test_plugins_are_called_by_index_then_name(node: Node,
                                               plugins: Callable[..., PluginThread]) -> None:
    order: list[str] = []
    lock = threading.Lock()

    def record(tag: str) -> Callable[[PluginThread], None]:
        def setup(p: PluginThread) -> None:
            def on(method: str, req: Any) -> None:
                if method == "RunPodSandbox":
                    with lock:
                        order.append(tag)
            p.plugin.on_event = on
        return setup

    for name, idx in (("b", "10"), ("a", "10"), ("z", "05"), ("a", "90")):
        plugins(name, idx, setup=record(f"{idx}-{name}"))
    node.run_pod("nri-plugin-order")
    assert order == ["05-z", "10-a", "10-b", "90-a"]


def _in_thread(fn: Callable[[], Any]) -> Future[Any]:
    pool = ThreadPoolExecutor(1)
    fut = pool.submit(fn)
    pool.shutdown(wait=False)
    return fut


def test_pod_hidden_while_its_run_hook_runs(node: Node,
                                            plugins: Callable[..., PluginThread]) -> None:
    p = plugins()
    p.plugin.delays["RunPodSandbox"] = 1.5
    run = _in_thread(lambda: node.run_pod("nri-hidden"))
    hooked = p.wait_for("RunPodSandbox")
    sid = hooked.pod.id
    listed = node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
    assert sid not in [s.id for s in listed]
    assert node.pod_status(sid).state == pb.SANDBOX_NOTREADY
    with pytest.raises(grpc.RpcError) as e:  # no workload container before the hooks end
        node.create(sid, node.pod_config("nri-hidden"), "early", SLEEP)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert run.result(30)[0] == sid
    assert node.pod_status(sid).state == pb.SANDBOX_READY


def test_container_hidden_while_its_create_hook_runs(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    p = plugins()
    sid, pod = node.run_pod("nri-hidden-c")
    p.plugin.delays["CreateContainer"] = 1.5
    create = _in_thread(lambda: node.create(sid, pod, "c", SLEEP))
    cid = p.wait_for("CreateContainer").container.id
    listed = node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers
    assert cid not in [c.id for c in listed]
    assert node.status(cid).state != pb.CONTAINER_CREATED
    assert create.result(30) == cid
    assert node.status(cid).state == pb.CONTAINER_CREATED


def test_stop_hook_sees_containers_stopped_and_pod_reachable(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    p = plugins()
    sid, pod = node.run_pod("nri-stop")
    cid = node.run(sid, pod, "c", SLEEP)
    p.plugin.delays["StopPodSandbox"] = 1.5
    stop = _in_thread(lambda: node.cri.runtime.StopPodSandbox(
        pb.StopPodSandboxRequest(pod_sandbox_id=sid)))
    p.wait_for("StopPodSandbox")
    assert node.status(cid).state == pb.CONTAINER_EXITED
    assert node.pod_status(sid).id == sid
    assert os.path.exists(f"/run/netns/pycri-{sid}")  # the network is still there
    stop.result(30)
    assert not os.path.exists(f"/run/netns/pycri-{sid}")


def test_failing_run_hook_leaves_nothing_and_retry_succeeds(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    p = plugins()
    p.plugin.errors["RunPodSandbox"] = "induced failure"
    cfg = node.pod_config("nri-fail")
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg))
    assert "plugin 50-test" in (e.value.details() or "")
    assert "induced failure" in (e.value.details() or "")
    failed = p.wait_for("RunPodSandbox").pod.id
    assert node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items == []
    assert leftovers(node.tmp, {failed}) == {"netns": [], "mounts": [], "conmon": [],
                                             "cgroups": []}
    assert host_local_leases(node) == []
    assert not (node.tmp / "root" / "sandboxes" / failed).exists()
    # Whoever heard of the pod hears it go.
    assert _for(p.events(), failed) == ["RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"]

    del p.plugin.errors["RunPodSandbox"]
    sid = node.cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg)).pod_sandbox_id
    assert sid != failed and node.pod_status(sid).state == pb.SANDBOX_READY


def test_failing_create_hook_leaves_nothing_and_retry_succeeds(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    p = plugins()
    sid, pod = node.run_pod("nri-cfail")
    p.plugin.errors["CreateContainer"] = "no such resource"
    with pytest.raises(grpc.RpcError) as e:
        node.create(sid, pod, "c", SLEEP)
    assert "no such resource" in (e.value.details() or "")
    failed = p.wait_for("CreateContainer").container.id
    assert node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers == []
    assert not (node.tmp / "state" / "bundles" / failed).exists()
    left = leftovers(node.tmp, {failed})  # the pod's own conmon and mounts stay
    assert [m for m in left["mounts"] if failed in m] == [] and left["cgroups"] == []
    assert subprocess.run(["pgrep", "-f", failed], capture_output=True).stdout == b""
    assert _for(p.events(), failed) == ["CreateContainer", "RemoveContainer"]

    del p.plugin.errors["CreateContainer"]
    cid = node.run(sid, pod, "c", SLEEP)  # the same name
    assert node.status(cid).state == pb.CONTAINER_RUNNING
    assert "StartContainer" not in _for(p.events(), failed)


def test_hanging_plugin_is_disconnected_and_the_rpc_proceeds(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    hung = plugins("hangs", "10")
    good = plugins("good", "20")
    hung.plugin.delays["RunPodSandbox"] = 30
    t0 = time.monotonic()
    sid, _ = node.run_pod("nri-hang")
    took = time.monotonic() - t0
    assert 1.9 < took < 10, took  # request_timeout is 2 s
    assert node.pod_status(sid).state == pb.SANDBOX_READY
    hung.wait_closed()
    good.wait_for("RunPodSandbox", lambda r: r.pod.id == sid)
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    good.wait_for("StopPodSandbox", lambda r: r.pod.id == sid)
    assert "StopPodSandbox" not in hung.names()


def test_plugin_dying_mid_call_does_not_fail_the_rpc(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    p = plugins()
    sid, pod = node.run_pod("nri-crash")
    p.plugin.delays["CreateContainer"] = 30

    def crash(method: str, req: Any) -> None:
        if method == "CreateContainer":
            threading.Thread(target=p.close).start()  # the connection drops mid-call
    p.plugin.on_event = crash
    t0 = time.monotonic()
    cid = node.create(sid, pod, "c", SLEEP)
    assert time.monotonic() - t0 < 2  # not the request timeout: the link is gone at once
    assert node.status(cid).state == pb.CONTAINER_CREATED
    again = plugins("again", "50")  # the daemon takes new plugins as before
    node.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=cid))
    again.wait_for("StartContainer", lambda r: r.container.id == cid)


def test_synchronize_with_existing_pods_and_containers(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    sid, pod = node.run_pod("nri-sync")
    running = node.run(sid, pod, "running", SLEEP)
    created = node.create(sid, pod, "created", SLEEP)
    p = plugins()
    synced = p.plugin.synced
    assert synced is not None
    assert sid in [q.id for q in synced.pods]
    states = {c.id: c for c in synced.containers}
    assert states[running].state == api.CONTAINER_RUNNING and states[running].pid > 0
    assert states[created].state == api.CONTAINER_CREATED
    assert list(states[running].args) == SLEEP
    later = node.create(sid, pod, "later", SLEEP)
    p.wait_for("CreateContainer", lambda r: r.container.id == later)


def test_synchronize_after_restart_sees_what_recovery_found(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    sid, pod = node.run_pod("nri-restart")
    cid = node.run(sid, pod, "c", SLEEP)
    before = plugins("before", "10")
    node.restart()
    before.wait_closed()
    after = plugins("after", "10")
    assert after.plugin.synced is not None
    c = next(c for c in after.plugin.synced.containers if c.id == cid)
    assert c.state == api.CONTAINER_RUNNING and list(c.args) == SLEEP
    assert sid in [q.id for q in after.plugin.synced.pods]


def test_synchronize_after_restart_waits_for_the_deferred_spec_read(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    """After a restart the recovered containers' specs are read when a plugin first
    connects, not before serving: one container's config.json is a FIFO here, so the
    read stays blocked until the test writes it. The restart still answers, RPCs go on
    during the read, and the plugin's Synchronize, sent once it is read, carries every
    container: the recovered ones with their specs, one created during the read, none
    removed during it."""
    sid, pod = node.run_pod("nri-deferred")
    held = node.run(sid, pod, "held", SLEEP)
    gone = node.run(sid, pod, "gone", SLEEP)
    created = node.create(sid, pod, "created", SLEEP)
    spec = node.proc.state / "bundles" / held / "config.json"
    content = spec.read_bytes()
    spec.unlink()
    os.mkfifo(spec, 0o600)
    try:
        node.restart(signal.SIGKILL)  # nothing reads the FIFO before serving
        late = plugins("late", "10", sync=False)  # configured; now waits for the read
        with open(_open_when_read(spec), "wb") as writer:  # its close is the reader's EOF
            assert node.status(held).state == pb.CONTAINER_RUNNING
            during = node.run(sid, pod, "during", SLEEP)
            node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=gone,
                                                                   timeout=0))
            node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=gone))
            assert "Synchronize" not in late.names()
            writer.write(content)
        late.wait_for("Synchronize")
    finally:
        spec.unlink(missing_ok=True)
        spec.write_bytes(content)
    synced = late.plugin.synced
    assert synced is not None
    by_id = {c.id: c for c in synced.containers}
    listed = {c.id for c in node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers}
    assert listed == {held, created, during} == set(by_id)
    assert list(by_id[held].args) == SLEEP and by_id[held].state == api.CONTAINER_RUNNING
    assert list(by_id[created].args) == SLEEP and list(by_id[during].args) == SLEEP
    assert sid in [q.id for q in synced.pods]


def _open_when_read(fifo: Path, timeout: float = 20.0) -> int:
    """A writing fd on `fifo` once someone has it open for reading (ENXIO until then)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
            continue
        os.set_blocking(fd, True)
        return fd


def test_no_container_missed_while_a_plugin_synchronizes(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    sid, pod = node.run_pod("nri-race")
    first = node.run(sid, pod, "first", SLEEP)
    late = plugins("late", "10", sync=False,
                   setup=lambda p: p.plugin.delays.__setitem__("Synchronize", 1.5))
    late.wait_for("Synchronize")
    during = [_in_thread(lambda n=n: node.run(sid, pod, f"during{n}", SLEEP)) for n in range(3)]
    ids = [f.result(60) for f in during]
    after = node.run(sid, pod, "after", SLEEP)
    synced = late.plugin.synced
    assert synced is not None
    in_sync = {c.id for c in synced.containers}
    for cid in [first, *ids, after]:
        announced = late.wait_for("CreateContainer", lambda r, cid=cid: r.container.id == cid,
                                  timeout=10) if cid not in in_sync else None
        assert cid in in_sync or announced is not None
    assert first in in_sync


def test_plugins_connecting_in_a_loop_leak_nothing(node: Node,
                                                   plugins: Callable[..., PluginThread]) -> None:
    sid, pod = node.run_pod("nri-loop")
    node.run(sid, pod, "c", SLEEP)
    assert node.proc.proc is not None
    fds = f"/proc/{node.proc.proc.pid}/fd"
    plugins("warmup").close()
    before = len(os.listdir(fds))
    for i in range(30):
        p = PluginThread("loop", f"{i % 100:02d}")
        try:
            p.connect(node.nri_socket)
            if i % 2:
                p.wait_for("Synchronize")  # half of them leave before synchronizing
        finally:
            p.close()
    for name, idx in (("bad name!", "xx"), ("trailing\n", "10"), ("ok", "10\n")):
        bad = PluginThread(name, idx)  # refused at registration
        with pytest.raises(TTRPCError):
            bad.connect(node.nri_socket, timeout=5)
        bad.close()
    last = plugins("last")  # the daemon still takes plugins, and knows the pod
    assert last.plugin.synced is not None and sid in [q.id for q in last.plugin.synced.pods]
    deadline = time.monotonic() + 10
    while len(os.listdir(fds)) > before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(os.listdir(fds)) <= before + 1  # only `last`'s connection


def install_recorder(node: Node) -> Path:
    """The test plugin as the node's pre-installed plugin 05-recorder, recording to the
    JSON-lines file returned (read at the next start or NRI reload)."""
    log = node.tmp / "preinstalled.jsonl"
    plugin_dir, conf_dir = node.tmp / "nri-plugins", node.tmp / "nri-conf.d"
    plugin_dir.mkdir()
    conf_dir.mkdir()
    exe = plugin_dir / "05-recorder"
    exe.write_text(f"#!/bin/sh\ncd {REPO} && exec {sys.executable} -m tests.lib.nri_plugin\n")
    exe.chmod(0o755)
    (conf_dir / "recorder.conf").write_text(f"log={log}\n")
    return log


def test_preinstalled_plugin_is_started_configured_and_stopped(node: Node) -> None:
    log = install_recorder(node)
    node.restart()  # pre-installed plugins start with the daemon
    sid, _ = node.run_pod("nri-pre")
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    methods = [x["method"] for x in lines]
    assert methods[:2] == ["Configure", "Synchronize"] and "RunPodSandbox" in methods
    assert lines[0]["request"]["config"] == f"log={log}\n"
    env = lines[0]["env"]
    assert (env["NRI_PLUGIN_NAME"], env["NRI_PLUGIN_IDX"]) == ("recorder", "05")
    assert env["NRI_PLUGIN_SOCKET"].isdigit()
    run = next(x for x in lines if x["method"] == "RunPodSandbox")
    assert run["request"]["pod"]["id"] == sid
    pid = lines[0]["pid"]
    node.restart()  # stopped with the daemon, started again
    assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_create_adjustment_reaches_the_process_and_post_create(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    p = plugins()
    adj = api.ContainerAdjustment(env=[api.KeyValue(key="FROM_NRI", value="yes")],
                                  annotations={"nri.test/x": "1"})
    p.plugin.replies["CreateContainer"] = api.CreateContainerResponse(adjust=adj)
    sid, pod = node.run_pod("nri-adjusted")
    cid = node.run(sid, pod, "c", SLEEP)
    assert b"FROM_NRI=yes" in node.exec(cid, "env").stdout
    spec = json.loads((node.tmp / "state" / "bundles" / cid / "config.json").read_text())
    assert spec["annotations"]["nri.test/x"] == "1"
    post = p.wait_for("PostCreateContainer", lambda r: r.container.id == cid)
    assert "FROM_NRI=yes" in post.container.env  # told what it was created with


def test_update_hook_changes_the_update_and_plugin_updates_fire_no_hook(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    p = plugins()
    sid, pod = node.run_pod("nri-update")
    cid = node.run(sid, pod, "c", SLEEP)

    def halve(req: Any) -> api.UpdateContainerResponse:
        u = api.ContainerUpdate(container_id=req.container.id)
        u.linux.resources.cpu.shares.value = req.linux_resources.cpu.shares.value // 2
        return api.UpdateContainerResponse(update=[u])
    p.plugin.replies["UpdateContainer"] = halve
    node.cri.runtime.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
        container_id=cid, linux=pb.LinuxContainerResources(cpu_shares=512)))
    assert node.status(cid).resources.linux.cpu_shares == 256

    hooks_before = p.names().count("UpdateContainer")
    u = api.ContainerUpdate(container_id=cid)
    u.linux.resources.cpu.shares.value = 128
    assert p.update_containers([u]) == []  # unsolicited: applied, no failure
    assert node.status(cid).resources.linux.cpu_shares == 128
    assert p.names().count("UpdateContainer") == hooks_before  # no news to the plugins


def test_plugin_hanging_in_synchronize_delays_requests_at_most_its_timeout(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    stuck = plugins("stuck", "10", sync=False,
                    setup=lambda p: p.plugin.delays.__setitem__("Synchronize", 60))
    stuck.wait_for("Synchronize")
    t0 = time.monotonic()
    sid, _ = node.run_pod("nri-stuck")  # its hook waits for the plugin's Synchronize
    assert time.monotonic() - t0 < 10  # registration_timeout is 5 s
    stuck.wait_closed()
    assert node.pod_status(sid).state == pb.SANDBOX_READY
    assert "RunPodSandbox" not in stuck.names()


def test_pod_resize_hooks_see_the_new_resources_and_a_refusal_changes_nothing(
        node: Node, plugins: Callable[..., PluginThread]) -> None:
    """UpdatePodSandboxResources: UpdatePodSandbox (before, an error fails the RPC) with
    the overhead and resources asked for, then PostUpdatePodSandbox once recorded."""
    p = plugins(events=("UpdatePodSandbox", "PostUpdatePodSandbox"))
    sid, _ = node.run_pod("nri-resize")

    def resize(shares: int) -> None:
        node.cri.runtime.UpdatePodSandboxResources(pb.UpdatePodSandboxResourcesRequest(
            pod_sandbox_id=sid,
            overhead=pb.LinuxContainerResources(cpu_shares=10),
            resources=pb.LinuxContainerResources(cpu_shares=shares,
                                                 memory_limit_in_bytes=64 << 20)))

    def recorded() -> int:
        info = json.loads(node.cri.runtime.PodSandboxStatus(pb.PodSandboxStatusRequest(
            pod_sandbox_id=sid, verbose=True)).info["info"])
        return int(info["podResources"]["resources"].get("cpuShares", 0))

    resize(300)
    p.wait_for("PostUpdatePodSandbox")
    assert _for(p.events(), sid) == ["UpdatePodSandbox", "PostUpdatePodSandbox"]
    req = next(r for m, r in p.events() if m == "UpdatePodSandbox")
    assert req.pod.id == sid and req.pod.name == "nri-resize"
    assert req.linux_resources.cpu.shares.value == 300
    assert req.linux_resources.memory.limit.value == 64 << 20
    assert req.overhead_linux_resources.cpu.shares.value == 10
    assert recorded() == 300

    p.plugin.errors["UpdatePodSandbox"] = "resize not allowed"
    with pytest.raises(grpc.RpcError) as e:
        resize(500)
    assert "resize not allowed" in (e.value.details() or "")
    assert recorded() == 300
    assert _for(p.events(), sid).count("PostUpdatePodSandbox") == 1
