"""NRI adjustments and updates on a real node: what plugins ask for is seen inside real
containers (env, a mount, an rlimit) and in their cgroups (memory limit), two plugins
setting one field fail CreateContainer and leave nothing, and updates a plugin sends, on
its own or in replies to CreateContainer, UpdateContainer and StopContainer, reach
other containers' cgroups."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from pycri.api import api_pb2 as pb
from pycri.nri.api import api_pb2 as api
from tests.e2e.conftest import Node
from tests.lib.faults import runtime_wrapper
from tests.lib.nri_plugin import PluginThread

SLEEP = ["sleep", "3600"]
MiB = 1 << 20


@pytest.fixture
def pod(node: Node) -> tuple[str, pb.PodSandboxConfig]:
    return node.run_pod("nri-adjust")


@pytest.fixture
def plugins(node: Node) -> Iterator[Callable[..., PluginThread]]:
    """Connects test plugins to the node; each is disconnected afterwards."""
    made: list[PluginThread] = []

    def connect(name: str, idx: str, events: tuple[str, ...] = ("CreateContainer",)
                ) -> PluginThread:
        p = PluginThread(name, idx, events)
        made.append(p)
        return p.connect(node.nri_socket)

    yield connect
    for p in made:
        p.close()


def for_container(name: str, reply: Any) -> Callable[[Any], Any]:
    """A CreateContainer reply for the container called `name` only."""
    def answer(req: api.CreateContainerRequest) -> Any:
        return reply if req.container.name == name else api.CreateContainerResponse()
    return answer


def runtime_spec(node: Node, cid: str) -> dict[str, Any]:
    info = node.cri.runtime.ContainerStatus(
        pb.ContainerStatusRequest(container_id=cid, verbose=True)).info["info"]
    spec: dict[str, Any] = json.loads(info)["runtimeSpec"]
    return spec


def memory_limit(node: Node, cid: str) -> int:
    path = runtime_spec(node, cid)["linux"]["cgroupsPath"].lstrip("/")
    return int((Path("/sys/fs/cgroup/memory") / path / "memory.limit_in_bytes").read_text())


def cpu_shares(node: Node, cid: str) -> int:
    path = runtime_spec(node, cid)["linux"]["cgroupsPath"].lstrip("/")
    return int((Path("/sys/fs/cgroup/cpu") / path / "cpu.shares").read_text())


def per_object_dirs(node: Node) -> set[str]:
    """The bundle and snapshot directories of every pod and container the node holds."""
    found: set[str] = set()
    for d in (node.tmp / "state" / "bundles", node.tmp / "root" / "snapshots"):
        if d.is_dir():
            found |= {str(p) for p in d.iterdir()}
    return found


def out(node: Node, cid: str, *cmd: str) -> str:
    r = node.exec(cid, *cmd)
    assert r.exit_code == 0, r.stderr
    return r.stdout.decode().strip()


def test_adjustments_are_seen_inside_the_container(
    node: Node, pod: tuple[str, pb.PodSandboxConfig], plugins: Callable[..., PluginThread],
    tmp_path: Path,
) -> None:
    sid, cfg = pod
    host = tmp_path / "nri-volume"
    host.mkdir()
    (host / "hello").write_text("from the plugin\n")
    first = api.CreateContainerResponse()
    adj = first.adjust
    adj.env.append(api.KeyValue(key="NRI_ENV", value="set by first"))
    adj.env.append(api.KeyValue(key="-DROPPED"))
    adj.mounts.append(api.Mount(destination="/nri", type="bind", source=str(host),
                                options=["rbind", "ro"]))
    adj.rlimits.append(api.POSIXRlimit(type="RLIMIT_NOFILE", soft=1234, hard=1234))
    adj.annotations["nri.test/first"] = "yes"
    second = api.CreateContainerResponse()
    second.adjust.linux.resources.memory.limit.value = 80 * MiB
    plugins("first", "10").plugin.replies["CreateContainer"] = for_container("adjusted", first)
    plugins("second", "20").plugin.replies["CreateContainer"] = for_container(
        "adjusted", second)

    cid = node.run(sid, cfg, "adjusted", SLEEP, envs=[pb.KeyValue(key="DROPPED", value=b"x")],
                   linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                       memory_limit_in_bytes=64 * MiB)))
    env = dict(line.split("=", 1) for line in out(node, cid, "env").splitlines())
    assert env["NRI_ENV"] == "set by first" and "DROPPED" not in env
    assert out(node, cid, "cat", "/nri/hello") == "from the plugin"
    assert node.exec(cid, "touch", "/nri/x").exit_code != 0  # read-only, as asked
    assert out(node, cid, "sh", "-c", "ulimit -n") == "1234"
    assert memory_limit(node, cid) == 80 * MiB  # the plugin's, not the request's 64 MiB
    spec = runtime_spec(node, cid)
    assert spec["annotations"]["nri.test/first"] == "yes"
    # A container the plugins leave alone is untouched.
    plain = node.run(sid, cfg, "plain", SLEEP)
    assert "NRI_ENV" not in out(node, plain, "env")
    assert out(node, plain, "sh", "-c", "ulimit -n") != "1234"


def test_two_plugins_setting_one_field_fail_create_and_leave_nothing(
    node: Node, pod: tuple[str, pb.PodSandboxConfig], plugins: Callable[..., PluginThread],
) -> None:
    sid, cfg = pod
    one, two = api.CreateContainerResponse(), api.CreateContainerResponse()
    one.adjust.env.append(api.KeyValue(key="SAME", value="1"))
    two.adjust.env.append(api.KeyValue(key="SAME", value="2"))
    alpha = plugins("alpha", "10")
    beta = plugins("beta", "20")
    alpha.plugin.replies["CreateContainer"] = one
    beta.plugin.replies["CreateContainer"] = two
    before = per_object_dirs(node)

    with pytest.raises(grpc.RpcError) as e:
        node.create(sid, cfg, "conflict", SLEEP)
    details = e.value.details() or ""
    assert "alpha" in details and "beta" in details and "Env 'SAME'" in details, details
    assert node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers == []
    assert per_object_dirs(node) == before  # no bundle, no rootfs snapshot left

    # One plugin backs off: the same name is created, with the other plugin's value.
    beta.plugin.replies["CreateContainer"] = api.CreateContainerResponse()
    cid = node.run(sid, cfg, "conflict", SLEEP)
    assert "SAME=1" in out(node, cid, "env").splitlines()


def test_unsolicited_update_changes_another_containers_cgroup(
    node: Node, pod: tuple[str, pb.PodSandboxConfig], plugins: Callable[..., PluginThread],
) -> None:
    sid, cfg = pod
    cid = node.run(sid, cfg, "target", SLEEP, linux=pb.LinuxContainerConfig(
        resources=pb.LinuxContainerResources(memory_limit_in_bytes=64 * MiB, cpu_shares=256)))
    assert memory_limit(node, cid) == 64 * MiB
    p = plugins("updater", "30")
    u = api.ContainerUpdate(container_id=cid)
    u.linux.resources.memory.limit.value = 96 * MiB
    assert p.update_containers([u]) == []
    assert memory_limit(node, cid) == 96 * MiB
    res = node.status(cid).resources.linux
    assert res.memory_limit_in_bytes == 96 * MiB
    assert res.cpu_shares == 256 and cpu_shares(node, cid) == 256  # untouched fields stay

    # Updates that cannot be done come back as failed, unless failure is ignored.
    gone = api.ContainerUpdate(container_id="0" * 64)
    gone.linux.resources.cpu.shares.value = 100
    bad = api.ContainerUpdate(container_id=cid)
    bad.linux.resources.memory.limit.value = 1024  # below what the CRI allows
    ignored = api.ContainerUpdate(container_id="f" * 64, ignore_failure=True)
    ignored.linux.resources.cpu.shares.value = 100
    failed = p.update_containers([gone, bad, ignored])
    assert [f.container_id for f in failed] == [gone.container_id, cid]
    assert memory_limit(node, cid) == 96 * MiB


def test_updates_at_once_to_one_container_compose(
    node: Node, plugins: Callable[..., PluginThread],
) -> None:
    """Two plugins update one container at once, each a field of its own: both changes
    stay. The runtime's `update` is slowed down, so the second update arrives while the
    first is applied: each is computed from the recorded resources under the container's
    lock, not from what was recorded before the other finished."""
    work = node.tmp / "slow-update"
    work.mkdir()
    node.add_runtime("slowupdate", runtime_wrapper(
        "runc, each update taking a second longer while the switch file exists",
        f'if [ "$sub" = update ] && [ -e {work}/slow ]; then sleep 1; fi\n'
        'exec /usr/sbin/runc "$@"\n'))
    cfg = node.pod_config("nri-compose")
    sid = node.cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(
        config=cfg, runtime_handler="slowupdate")).pod_sandbox_id
    cid = node.run(sid, cfg, "target", SLEEP, linux=pb.LinuxContainerConfig(
        resources=pb.LinuxContainerResources(memory_limit_in_bytes=64 * MiB, cpu_shares=256)))
    memory, shares = plugins("memory", "30"), plugins("shares", "31")
    more_memory = api.ContainerUpdate(container_id=cid)
    more_memory.linux.resources.memory.limit.value = 96 * MiB
    more_shares = api.ContainerUpdate(container_id=cid)
    more_shares.linux.resources.cpu.shares.value = 512
    (work / "slow").touch()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(memory.update_containers, [more_memory])
        time.sleep(0.3)  # the first is in the runtime's update now
        second = pool.submit(shares.update_containers, [more_shares])
        assert first.result(30) == [] and second.result(30) == []
    res = node.status(cid).resources.linux
    assert (res.memory_limit_in_bytes, res.cpu_shares) == (96 * MiB, 512)
    assert memory_limit(node, cid) == 96 * MiB and cpu_shares(node, cid) == 512


def test_updates_in_replies_reach_the_containers_they_name(
    node: Node, pod: tuple[str, pb.PodSandboxConfig], plugins: Callable[..., PluginThread],
) -> None:
    sid, cfg = pod
    small = pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
        memory_limit_in_bytes=64 * MiB))
    a = node.run(sid, cfg, "updated", SLEEP, linux=small)
    b = node.run(sid, cfg, "bystander", SLEEP, linux=small)
    p = plugins("neighbour", "40", ("CreateContainer", "UpdateContainer", "StopContainer"))

    # At UpdateContainer of a: b gets more memory.
    at_update = api.UpdateContainerResponse()
    other = at_update.update.add(container_id=b)
    other.linux.resources.memory.limit.value = 100 * MiB
    p.plugin.replies["UpdateContainer"] = lambda req: (
        at_update if req.container.id == a else api.UpdateContainerResponse())
    node.cri.runtime.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
        container_id=a, linux=pb.LinuxContainerResources(memory_limit_in_bytes=72 * MiB)))
    assert memory_limit(node, a) == 72 * MiB
    assert memory_limit(node, b) == 100 * MiB
    assert node.status(b).resources.linux.memory_limit_in_bytes == 100 * MiB

    # At CreateContainer of a third one: a gets more memory.
    at_create = api.CreateContainerResponse()
    upd = at_create.update.add(container_id=a)
    upd.linux.resources.memory.limit.value = 120 * MiB
    p.plugin.replies["CreateContainer"] = for_container("third", at_create)
    third = node.run(sid, cfg, "third", SLEEP, linux=small)
    assert memory_limit(node, a) == 120 * MiB

    # At StopContainer of the third: b gets more again.
    at_stop = api.StopContainerResponse()
    again = at_stop.update.add(container_id=b)
    again.linux.resources.memory.limit.value = 130 * MiB
    p.plugin.replies["StopContainer"] = lambda req: (
        at_stop if req.container.id == third else api.StopContainerResponse())
    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=third, timeout=0))
    assert memory_limit(node, b) == 130 * MiB


def _relative_mount(adj: api.ContainerAdjustment, tmp: Path) -> None:
    adj.mounts.append(api.Mount(destination="relative", type="bind", source=str(tmp),
                                options=["rbind"]))


def _cdi_device(adj: api.ContainerAdjustment, tmp: Path) -> None:
    adj.CDI_devices.append(api.CDIDevice(name="vendor.example/gpu=0"))


def _missing_source(adj: api.ContainerAdjustment, tmp: Path) -> None:
    adj.mounts.append(api.Mount(destination="/gone", type="bind", source=str(tmp / "absent"),
                                options=["rbind"]))


@pytest.mark.parametrize("setup,problem", [
    (_relative_mount, 'bad": mount destination \'relative\' must be an absolute path'),
    (_cdi_device, "unknown CDI device vendor.example/gpu=0"),
    (_missing_source, "absent"),
], ids=["invalid-value", "unresolvable-cdi", "runtime-refuses"])
def test_an_adjustment_that_cannot_be_done_fails_create_and_leaves_nothing(
    node: Node, pod: tuple[str, pb.PodSandboxConfig], plugins: Callable[..., PluginThread],
    tmp_path: Path, setup: Callable[[api.ContainerAdjustment, Path], None], problem: str,
) -> None:
    sid, cfg = pod
    reply = api.CreateContainerResponse()
    setup(reply.adjust, tmp_path)
    p = plugins("bad", "10")
    p.plugin.replies["CreateContainer"] = reply
    before = per_object_dirs(node)
    with pytest.raises(grpc.RpcError) as e:
        node.create(sid, cfg, "refused", SLEEP)
    assert problem in (e.value.details() or ""), e.value.details()
    assert node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers == []
    assert per_object_dirs(node) == before
    p.plugin.replies["CreateContainer"] = api.CreateContainerResponse()
    node.run(sid, cfg, "refused", SLEEP)


def test_a_plugin_injects_a_cdi_device_resolved_from_the_nodes_spec_files(
    node: Node, plugins: Callable[..., PluginThread],
) -> None:
    """An NRI plugin naming a CDI device gets it resolved like ContainerConfig.CDI_devices:
    from the node's [cdi] spec_dirs, edits applied to the container's spec."""
    cdi_dir = node.tmp / "cdi-specs"
    cdi_dir.mkdir()
    (cdi_dir / "null.json").write_text(json.dumps({
        "cdiVersion": "0.6.0", "kind": "pycri.test/nri",
        "devices": [{"name": "null", "containerEdits": {
            "deviceNodes": [{"path": "/dev/nri-cdi-null", "hostPath": "/dev/null"}],
            "env": ["FROM_CDI_VIA_NRI=1"]}}],
    }))
    with open(node.proc.config, "a") as f:
        f.write(f"[cdi]\nspec_dirs = {json.dumps([str(cdi_dir)])}\n")
    node.restart()
    sid, cfg = node.run_pod("nri-cdi")
    reply = api.CreateContainerResponse()
    reply.adjust.CDI_devices.append(api.CDIDevice(name="pycri.test/nri=null"))
    p = plugins("cdi", "10")
    p.plugin.replies["CreateContainer"] = for_container("with-device", reply)
    cid = node.run(sid, cfg, "with-device", SLEEP)
    assert "FROM_CDI_VIA_NRI=1" in out(node, cid, "env")
    listing = out(node, cid, "ls", "-l", "/dev/nri-cdi-null")
    assert listing.startswith("c"), listing
