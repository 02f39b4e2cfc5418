"""Containers end to end: real images, conmon, runc and crun, cgroups and logs."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node

pytestmark = pytest.mark.e2e

CRI_LOG_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+(Z|[+-]\d\d:\d\d) (stdout|stderr) (P|F) (.*)$"
)
SLEEP = ["sleep", "1000"]


def wait_state(node: Node, cid: str, state: int, timeout: float = 15) -> pb.ContainerStatus:
    deadline = time.monotonic() + timeout
    while True:
        st = node.status(cid)
        if st.state == state or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


def security(**kw: object) -> pb.LinuxContainerConfig:
    return pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(**kw))  # type: ignore[arg-type]


@pytest.fixture
def pod(node: Node) -> tuple[str, pb.PodSandboxConfig]:
    return node.run_pod("ctr")


@pytest.mark.parametrize("handler", ["runc", "crun"])
def test_lifecycle_logs_and_status(node: Node, handler: str) -> None:
    sid, cfg = node.run_pod(f"life-{handler}")
    if handler == "crun":
        node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
        node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
        sid = node.cri.runtime.RunPodSandbox(
            pb.RunPodSandboxRequest(config=cfg, runtime_handler="crun")
        ).pod_sandbox_id
    cid = node.create(sid, cfg, "logger", ["sh", "-c", "echo out; echo err >&2; printf part"],
                      labels={"k": "v"}, annotations={"an": "x"})
    st = node.status(cid)
    assert st.state == pb.CONTAINER_CREATED
    assert st.started_at == 0
    node.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=cid))
    st = wait_state(node, cid, pb.CONTAINER_EXITED)
    assert st.state == pb.CONTAINER_EXITED
    assert (st.exit_code, st.reason) == (0, "Completed")
    assert st.created_at <= st.started_at <= st.finished_at
    assert st.image.image == node.image
    assert st.image_id.startswith("sha256:") and st.image_ref
    assert dict(st.labels) == {"k": "v"} and dict(st.annotations) == {"an": "x"}
    assert st.log_path == str(node.log_dir / f"life-{handler}" / "logger.log")
    lines = Path(st.log_path).read_text().splitlines()
    parsed = [CRI_LOG_LINE.match(line) for line in lines]
    assert all(parsed), lines
    entries = sorted((m.group(2), m.group(3), m.group(4)) for m in parsed if m)
    assert entries == [("stderr", "F", "err"), ("stdout", "F", "out"), ("stdout", "P", "part")]
    info = json.loads(node.cri.runtime.ContainerStatus(
        pb.ContainerStatusRequest(container_id=cid, verbose=True)).info["info"])
    assert info["runtimeHandler"] == handler
    listed = node.cri.runtime.ListContainers(pb.ListContainersRequest(
        filter=pb.ContainerFilter(pod_sandbox_id=sid, label_selector={"k": "v"}))).containers
    assert [c.id for c in listed] == [cid]


def test_exit_codes_and_reasons(node: Node, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    sid, cfg = pod
    failing = node.run(sid, cfg, "fails", ["sh", "-c", "exit 3"])
    st = wait_state(node, failing, pb.CONTAINER_EXITED)
    assert (st.exit_code, st.reason) == (3, "Error")


def test_oom_killed(node: Node, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    sid, cfg = pod
    limit = 32 * 1024 * 1024
    cid = node.run(sid, cfg, "hog", ["sh", "-c", "head -c 200m /dev/zero | tail"],
                   linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                       memory_limit_in_bytes=limit)))
    st = wait_state(node, cid, pb.CONTAINER_EXITED, timeout=30)
    assert (st.exit_code, st.reason) == (137, "OOMKilled")


def test_stop_signal_and_timeout(node: Node, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    sid, cfg = pod
    polite = node.run(sid, cfg, "polite", ["sh", "-c", "trap 'exit 42' TERM; : > /trapped; "
                                           "while true; do sleep 0.1; done"])
    stubborn = node.run(sid, cfg, "stubborn", ["sh", "-c", "trap '' TERM; : > /trapped; "
                                               "while true; do sleep 0.1; done"])
    for cid in (polite, stubborn):  # the shells have installed their traps
        node.wait_for_file(cid, "/trapped")
    t0 = time.monotonic()
    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=polite, timeout=10))
    assert time.monotonic() - t0 < 5
    assert node.status(polite).exit_code == 42
    t0 = time.monotonic()
    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=stubborn, timeout=1))
    assert 0.9 < time.monotonic() - t0 < 10
    st = node.status(stubborn)
    assert (st.state, st.exit_code) == (pb.CONTAINER_EXITED, 137)
    # Stop and remove are idempotent, also for unknown IDs.
    for cid in (polite, "f" * 64):
        node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0))
        node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
        node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
    with pytest.raises(grpc.RpcError) as e:
        node.status(polite)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_bad_requests(node: Node, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    sid, cfg = pod
    rt = node.cri.runtime
    cases: list[tuple[pb.CreateContainerRequest, grpc.StatusCode]] = [
        (pb.CreateContainerRequest(pod_sandbox_id="0" * 64, sandbox_config=cfg,
                                   config=node.container_config("x", SLEEP)),
         grpc.StatusCode.NOT_FOUND),
        (pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=cfg,
                                   config=pb.ContainerConfig(
                                       metadata=pb.ContainerMetadata(name="x"),
                                       image=pb.ImageSpec(image="nope:1"))),
         grpc.StatusCode.NOT_FOUND),
        (pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=cfg,
                                   config=node.container_config("x", SLEEP, mounts=[pb.Mount(
                                       container_path="/m", host_path="/nonexistent/dir")])),
         grpc.StatusCode.INVALID_ARGUMENT),
        (pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=cfg,
                                   config=node.container_config("x", SLEEP, linux=security(
                                       run_as_username="nosuchuser"))),
         grpc.StatusCode.INVALID_ARGUMENT),
        (pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=cfg,
                                   config=node.container_config("x", SLEEP, linux=security(
                                       run_as_group=pb.Int64Value(value=5)))),
         grpc.StatusCode.INVALID_ARGUMENT),
        (pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=cfg,
                                   config=node.container_config("x", SLEEP, mounts=[pb.Mount(
                                       container_path="/img",
                                       image=pb.ImageSpec(image=node.image))])),
         grpc.StatusCode.INVALID_ARGUMENT),  # an image volume must ask for readonly
    ]
    for req, code in cases:
        with pytest.raises(grpc.RpcError) as e:
            rt.CreateContainer(req)
        assert e.value.code() == code, e.value.details()
    assert not rt.ListContainers(pb.ListContainersRequest()).containers
    assert not list((node.tmp / "root" / "snapshots").glob("*"))
    cid = node.create(sid, cfg, "dup", SLEEP)
    with pytest.raises(grpc.RpcError) as e:
        node.create(sid, cfg, "dup", SLEEP)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    rt.StartContainer(pb.StartContainerRequest(container_id=cid))
    with pytest.raises(grpc.RpcError) as e:
        rt.StartContainer(pb.StartContainerRequest(container_id=cid))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_user_groups_caps_readonly(node: Node, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    sid, cfg = pod
    cid = node.run(sid, cfg, "who", SLEEP, linux=security(
        run_as_user=pb.Int64Value(value=1000), run_as_group=pb.Int64Value(value=2000),
        supplemental_groups=[3000], readonly_rootfs=True,
        capabilities=pb.Capability(drop_capabilities=["ALL"],
                                   add_capabilities=["NET_ADMIN"])))
    assert node.exec(cid, "id", "-u").stdout.strip() == b"1000"
    assert node.exec(cid, "id", "-g").stdout.strip() == b"2000"
    assert set(node.exec(cid, "id", "-G").stdout.split()) == {b"2000", b"3000"}
    status = node.exec(cid, "cat", "/proc/self/status").stdout.decode()
    bounding = re.search(r"CapBnd:\s+([0-9a-f]+)", status)
    assert bounding and int(bounding.group(1), 16) == 1 << 12  # CAP_NET_ADMIN only
    assert node.exec(cid, "touch", "/newfile").exit_code != 0
    st = node.status(cid)
    assert (st.user.linux.uid, st.user.linux.gid) == (1000, 2000)
    named = node.run(sid, cfg, "named", SLEEP, linux=security(run_as_username="user2"))
    assert node.exec(named, "id", "-un").stdout.strip() == b"user2"


def test_seccomp_runtime_default_and_unconfined(
    node: Node, pod: tuple[str, pb.PodSandboxConfig]
) -> None:
    sid, cfg = pod
    default = node.run(sid, cfg, "confined", SLEEP, linux=security(
        seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault)))
    unconfined = node.run(sid, cfg, "free", SLEEP, linux=security(
        seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.Unconfined)))
    assert node.exec(default, "unshare", "-U", "true").exit_code != 0
    assert node.exec(unconfined, "unshare", "-U", "true").exit_code == 0


def test_bind_mounts(node: Node, pod: tuple[str, pb.PodSandboxConfig], tmp_path: Path) -> None:
    sid, cfg = pod
    host = tmp_path / "vol"
    host.mkdir()
    (host / "f").write_text("from host\n")
    cid = node.run(sid, cfg, "mounts", SLEEP, mounts=[
        pb.Mount(container_path="/rw", host_path=str(host)),
        pb.Mount(container_path="/ro", host_path=str(host), readonly=True),
    ])
    assert node.exec(cid, "cat", "/ro/f").stdout == b"from host\n"
    assert node.exec(cid, "sh", "-c", "echo x > /rw/new").exit_code == 0
    assert (host / "new").read_text() == "x\n"
    assert node.exec(cid, "sh", "-c", "echo y > /ro/new2").exit_code != 0
    assert node.status(cid).mounts[1].readonly


def test_update_resources_changes_the_cgroup(
    node: Node, pod: tuple[str, pb.PodSandboxConfig]
) -> None:
    sid, cfg = pod
    cid = node.run(sid, cfg, "upd", SLEEP, linux=pb.LinuxContainerConfig(
        resources=pb.LinuxContainerResources(memory_limit_in_bytes=64 << 20)))
    spec = json.loads(node.cri.runtime.ContainerStatus(pb.ContainerStatusRequest(
        container_id=cid, verbose=True)).info["info"])["runtimeSpec"]
    cgroup = Path("/sys/fs/cgroup/memory") / spec["linux"]["cgroupsPath"].lstrip("/")
    assert int((cgroup / "memory.limit_in_bytes").read_text()) == 64 << 20
    node.cri.runtime.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
        container_id=cid, linux=pb.LinuxContainerResources(memory_limit_in_bytes=96 << 20)))
    assert int((cgroup / "memory.limit_in_bytes").read_text()) == 96 << 20
    assert node.status(cid).resources.linux.memory_limit_in_bytes == 96 << 20
    node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
    assert not cgroup.exists()


def test_resources_the_kernel_refuses_are_invalid_argument_and_change_nothing(
    node: Node, pod: tuple[str, pb.PodSandboxConfig]
) -> None:
    """A well-formed cpuset naming CPUs the node lacks passes the gate; the kernel refuses
    it. That is the request's fault (InvalidArgument), not UNKNOWN, and nothing changes."""
    sid, cfg = pod
    cid = node.run(sid, cfg, "refused", SLEEP, linux=pb.LinuxContainerConfig(
        resources=pb.LinuxContainerResources(memory_limit_in_bytes=64 << 20)))
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
            container_id=cid, linux=pb.LinuxContainerResources(
                memory_limit_in_bytes=96 << 20, cpuset_cpus="4000")))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert "the kernel refused" in (e.value.details() or "")
    st = node.status(cid)
    assert st.state == pb.CONTAINER_RUNNING
    assert st.resources.linux.memory_limit_in_bytes == 64 << 20
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=sid, sandbox_config=cfg, config=node.container_config(
                "refused-create", SLEEP, linux=pb.LinuxContainerConfig(
                    resources=pb.LinuxContainerResources(cpuset_cpus="4000")))))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    names = [c.metadata.name for c in node.cri.runtime.ListContainers(
        pb.ListContainersRequest()).containers]
    assert "refused-create" not in names


def test_exec_sync(node: Node, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    sid, cfg = pod
    cid = node.run(sid, cfg, "ex", SLEEP)
    r = node.exec(cid, "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code) == (b"out\n", b"err\n", 3)
    t0 = time.monotonic()
    r = node.exec(cid, "sh", "-c", "sleep 100 & echo bg", timeout=5)
    assert r.stdout == b"bg\n" and r.exit_code == 0
    assert time.monotonic() - t0 < 4
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        node.exec(cid, "sleep", "30", timeout=1)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 5
    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0))
    with pytest.raises(grpc.RpcError) as e:
        node.exec(cid, "true")
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_reopen_log(node: Node, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    sid, cfg = pod
    cid = node.run(sid, cfg, "ticker", ["sh", "-c", "while true; do echo tick; sleep 0.1; done"])
    log = Path(node.status(cid).log_path)
    time.sleep(0.3)
    log.rename(log.with_suffix(".1"))
    node.cri.runtime.ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=cid))
    time.sleep(0.3)
    assert "stdout F tick" in log.read_text()
    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0))
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=cid))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_links_planted_in_the_pod_log_directory_are_refused(
    node: Node, pod: tuple[str, pb.PodSandboxConfig], tmp_path: Path
) -> None:
    """Issue 41: a container's log file that was already a link to a root-owned file
    outside the log dir got the container's output, and a linked directory under the log
    dir had the log made through it. Now CreateContainer is InvalidArgument, nothing is
    created, nothing outside is written; so is ReopenContainerLog where a link stands at
    the name conmon writes the fresh log to (it would truncate the link's target)."""
    sid, cfg = pod
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "shadow"
    secret.write_bytes(b"root:x\n")
    logs = Path(cfg.log_directory)
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "planted.log").symlink_to(secret)
    (logs / "linked").symlink_to(outside)
    for name, log_path in (("planted", "planted.log"), ("linked", "linked/0.log")):
        config = node.container_config(name, ["echo", "into the log"])
        config.log_path = log_path
        with pytest.raises(grpc.RpcError) as e:
            node.cri.runtime.CreateContainer(pb.CreateContainerRequest(
                pod_sandbox_id=sid, config=config, sandbox_config=cfg))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert "is a symbolic link; nothing was written" in str(e.value.details())
    assert node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers == []
    assert sorted(os.listdir(outside)) == ["shadow"] and secret.read_bytes() == b"root:x\n"

    cid = node.run(sid, cfg, "ticker", ["sh", "-c", "while true; do echo tick; sleep 0.1; done"])
    log = Path(node.status(cid).log_path)
    assert stat.S_IMODE(log.stat().st_mode) == 0o640
    log.rename(log.with_suffix(".1"))
    Path(f"{log}.tmp").symlink_to(secret)
    with pytest.raises(grpc.RpcError) as e:
        node.cri.runtime.ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=cid))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert secret.read_bytes() == b"root:x\n"
    Path(f"{log}.tmp").unlink()
    node.cri.runtime.ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=cid))
    deadline = time.monotonic() + 10
    while "stdout F tick" not in log.read_text():
        assert time.monotonic() < deadline, "no output in the reopened log"
        time.sleep(0.1)


def test_restart_keeps_status_and_sees_missed_exits(
    node: Node, pod: tuple[str, pb.PodSandboxConfig]
) -> None:
    sid, cfg = pod
    runner = node.run(sid, cfg, "runner", SLEEP)
    quitter = node.run(sid, cfg, "quitter", ["sh", "-c", "read x < /dev/zero; exit 7"])
    node.cri.channel.close()
    node.proc.kill()  # kill -9 pycri
    pid = node_pid(node, quitter)
    os.kill(pid, signal.SIGKILL)  # exits while pycri is down
    while Path(f"/proc/{pid}").exists():
        time.sleep(0.02)
    time.sleep(0.2)
    down_at = time.time_ns()
    node.start()
    st = node.status(quitter)
    assert (st.state, st.exit_code) == (pb.CONTAINER_EXITED, 137)
    assert st.finished_at <= down_at
    assert node.status(runner).state == pb.CONTAINER_RUNNING
    assert node.exec(runner, "echo", "alive").stdout == b"alive\n"
    node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=runner, timeout=0))
    assert node.status(runner).exit_code == 137


def node_pid(node: Node, cid: str) -> int:
    return int((node.tmp / "state" / "bundles" / cid / "monitor" / "pidfile").read_text())


def test_fifty_containers_without_leaks(
    node: Node, pod: tuple[str, pb.PodSandboxConfig]
) -> None:
    sid, cfg = pod
    ids = [node.run(sid, cfg, f"c{i}", SLEEP) for i in range(50)]
    assert all(node.status(c).state == pb.CONTAINER_RUNNING for c in ids)
    mem = Path("/sys/fs/cgroup/memory/pycri")
    assert all((mem / c).exists() for c in ids)
    for c in ids:
        node.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=c, timeout=0))
        node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=c))
    assert not node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers
    assert not any((mem / c).exists() for c in ids)
    assert not list((node.tmp / "root" / "snapshots").glob("*"))
    assert not list((node.tmp / "state" / "bundles").glob("*"))[1:]  # only the infra's
    mounts = Path("/proc/mounts").read_text()
    assert not any(c in mounts for c in ids)


def test_stats(node: Node, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    sid, cfg = pod
    busy = node.run(sid, cfg, "busy", ["sh", "-c", "while true; do :; done"], labels={"s": "1"})
    idle = node.create(sid, cfg, "idle", SLEEP)
    time.sleep(0.5)
    rt = node.cri.runtime
    first = rt.ContainerStats(pb.ContainerStatsRequest(container_id=busy)).stats
    time.sleep(0.5)
    second = rt.ContainerStats(pb.ContainerStatsRequest(container_id=busy)).stats
    assert second.attributes.id == busy
    assert second.cpu.timestamp > first.cpu.timestamp > 0
    assert second.cpu.usage_core_nano_seconds.value > first.cpu.usage_core_nano_seconds.value
    assert second.cpu.usage_nano_cores.value > 10**8  # a spinning shell uses > 0.1 core
    assert second.memory.working_set_bytes.value > 0
    assert second.writable_layer.fs_id.mountpoint
    everything = rt.ListContainerStats(pb.ListContainerStatsRequest()).stats
    assert {s.attributes.id for s in everything} == {busy, idle}
    labelled = rt.ListContainerStats(pb.ListContainerStatsRequest(
        filter=pb.ContainerStatsFilter(label_selector={"s": "1"}))).stats
    assert [s.attributes.id for s in labelled] == [busy]
    with pytest.raises(grpc.RpcError) as e:
        rt.ContainerStats(pb.ContainerStatsRequest(container_id="0" * 64))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.fixture
def shared_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory that is its own rshared mount point (as a kubelet volume dir is)."""
    d = tmp_path / "shared"
    d.mkdir()
    subprocess.run(["mount", "--bind", str(d), str(d)], check=True)
    subprocess.run(["mount", "--make-rshared", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-R", "-l", str(d)], check=False)


@pytest.mark.parametrize(
    ("propagation", "host_to_container", "container_to_host"),
    [
        (pb.PROPAGATION_PRIVATE, False, False),
        (pb.PROPAGATION_HOST_TO_CONTAINER, True, False),
        (pb.PROPAGATION_BIDIRECTIONAL, True, True),
    ],
)
def test_mount_propagation(
    node: Node, shared_dir: Path, propagation: int, host_to_container: bool,
    container_to_host: bool,
) -> None:
    privileged = pb.LinuxSandboxSecurityContext(privileged=True)
    sid, pod = node.run_pod("prop", linux=pb.LinuxPodSandboxConfig(security_context=privileged))
    (shared_dir / "from-host").mkdir()
    (shared_dir / "from-ctr").mkdir()
    cid = node.run(sid, pod, "c", SLEEP, mounts=[pb.Mount(
        container_path="/vol", host_path=str(shared_dir), propagation=propagation)],
        linux=security(privileged=True))
    subprocess.run(["mount", "-t", "tmpfs", "hostfs", str(shared_dir / "from-host")], check=True)
    (shared_dir / "from-host" / "mark").write_text("x")
    seen = node.exec(cid, "ls", "/vol/from-host").stdout
    assert (b"mark" in seen) == host_to_container
    r = node.exec(cid, "sh", "-c", "mount -t tmpfs ctrfs /vol/from-ctr && touch /vol/from-ctr/m")
    assert r.exit_code == 0, r.stderr
    assert (shared_dir / "from-ctr" / "m").exists() == container_to_host


def test_pod_stats(node: Node, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    sid, cfg = pod
    a = node.run(sid, cfg, "a", SLEEP)
    node.run(sid, cfg, "b", ["sh", "-c", "sleep 1000 & sleep 1000"])
    gateway = node.subnet.rsplit(".", 1)[0] + ".1"
    assert node.exec(a, "ping", "-c", "1", "-W", "2", gateway).exit_code == 0
    rt = node.cri.runtime
    st = rt.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=sid)).stats
    assert st.attributes.id == sid
    linux = st.linux
    assert len(linux.containers) == 2
    assert linux.cpu.usage_core_nano_seconds.value > 0
    assert linux.memory.working_set_bytes.value > 0
    assert linux.process.process_count.value == 3  # a: sleep; b: sh exec'd into 2 sleeps
    assert linux.network.default_interface.name == "eth0"
    assert linux.network.default_interface.tx_bytes.value > 0
    assert [s.attributes.id for s in rt.ListPodSandboxStats(
        pb.ListPodSandboxStatsRequest()).stats] == [sid]


def test_runtime_failure_names_the_step(node: Node, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    sid, cfg = pod
    with pytest.raises(grpc.RpcError) as e:
        node.create(sid, cfg, "nope", ["/no/such/binary"])
    # A command the image cannot run is the request's fault, not an unknown failure.
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "creating the container" in (e.value.details() or "")
    assert "/no/such/binary" in (e.value.details() or "")
    assert not node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers


def test_unrunnable_commands_and_a_file_as_working_dir_are_invalid_argument(
    node: Node, pod: tuple[str, pb.PodSandboxConfig]
) -> None:
    """Found by fuzzing: each came back UNKNOWN from the runtime."""
    sid, cfg = pod
    cid = node.run(sid, cfg, "target", SLEEP)
    for argv in (["no-such-program"], ["/no/such/binary"], ["/etc/passwd"]):
        with pytest.raises(grpc.RpcError) as e:
            node.exec(cid, *argv)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert argv[0] in (e.value.details() or "")
    assert node.exec(cid, "true").exit_code == 0
    with pytest.raises(grpc.RpcError) as e:
        node.create(sid, cfg, "cwd", SLEEP, working_dir="/etc/passwd")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert "working directory /etc/passwd is a regular file" in (e.value.details() or "")
    assert [c.id for c in node.cri.runtime.ListContainers(
        pb.ListContainersRequest()).containers] == [cid]


def test_container_events_stream(node: Node) -> None:
    stream = node.cri.runtime.GetContainerEvents(pb.GetEventsRequest())
    try:
        sid, cfg = node.run_pod("events")
        cid = node.run(sid, cfg, "c", ["sh", "-c", "exit 0"])
        wait_state(node, cid, pb.CONTAINER_EXITED)
        node.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=cid))
        node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
        got: list[tuple[str, int]] = []
        for ev in stream:
            got.append((ev.container_id, ev.container_event_type))
            if ev.container_id == cid and ev.container_event_type == pb.CONTAINER_STARTED_EVENT:
                assert ev.pod_sandbox_status.id == sid
                assert [s.id for s in ev.containers_statuses] == [cid]
            if ev.container_id == sid and ev.container_event_type == pb.CONTAINER_STOPPED_EVENT:
                break
    finally:
        stream.cancel()
    assert got == [
        (sid, pb.CONTAINER_CREATED_EVENT), (sid, pb.CONTAINER_STARTED_EVENT),
        (cid, pb.CONTAINER_CREATED_EVENT), (cid, pb.CONTAINER_STARTED_EVENT),
        (cid, pb.CONTAINER_STOPPED_EVENT), (cid, pb.CONTAINER_DELETED_EVENT),
        (sid, pb.CONTAINER_STOPPED_EVENT),
    ]


@pytest.fixture
def tree_with_submount(tmp_path: Path) -> Iterator[Path]:
    """A directory with a writable tmpfs mounted inside it (what critest's rro spec uses)."""
    d = tmp_path / "rro-src"
    (d / "tmpfs").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "rrotest", str(d / "tmpfs")], check=True)
    try:
        yield d
    finally:
        if (d / "tmpfs").exists():
            subprocess.run(["umount", "-l", str(d / "tmpfs")], check=False)


def test_recursive_read_only_mounts(
    node: Node, pod: tuple[str, pb.PodSandboxConfig], tree_with_submount: Path
) -> None:
    sid, cfg = pod
    handlers = node.cri.runtime.Status(pb.StatusRequest()).runtime_handlers
    assert all(h.features.recursive_read_only_mounts for h in handlers)
    src = str(tree_with_submount)
    plain = node.run(sid, cfg, "ro", SLEEP, mounts=[
        pb.Mount(container_path="/mnt", host_path=src, readonly=True)])
    rro = node.run(sid, cfg, "rro", SLEEP, mounts=[
        pb.Mount(container_path="/mnt", host_path=src, readonly=True, recursive_read_only=True)])
    # Plain read-only: the submount stays writable. Recursive: it does not.
    assert node.exec(plain, "touch", "/mnt/tmpfs/a").exit_code == 0
    r = node.exec(rro, "touch", "/mnt/tmpfs/b")
    assert r.exit_code != 0 and b"Read-only file system" in r.stderr
    assert node.exec(rro, "touch", "/mnt/c").exit_code != 0
    # The host keeps no staged copy once the container exists, so the source stays
    # writable and its mount points can be removed while the container runs.
    (tree_with_submount / "tmpfs" / "host-write").write_text("ok")
    assert not (node.tmp / "state" / "rro" / rro).exists()
    assert str(node.tmp / "state" / "rro") not in Path("/proc/mounts").read_text()
    subprocess.run(["umount", "-l", str(tree_with_submount / "tmpfs")], check=True)
    (tree_with_submount / "tmpfs").rmdir()  # EBUSY if the host still held a copy
    for bad in (pb.Mount(container_path="/m", host_path=src, recursive_read_only=True),
                pb.Mount(container_path="/m", host_path=src, readonly=True,
                         recursive_read_only=True,
                         propagation=pb.PROPAGATION_HOST_TO_CONTAINER)):
        with pytest.raises(grpc.RpcError) as e:
            node.create(sid, cfg, "bad", SLEEP, mounts=[bad])
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_crash_during_create_container_frees_the_name_at_restart(node: Node) -> None:
    node.add_runtime("slow", '#!/bin/sh\ncase " $* " in *" create "*) sleep 2;; esac\n'
                             'exec /usr/sbin/runc "$@"\n')
    pod = node.pod_config("slowpod")
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=pod, runtime_handler="slow")).pod_sandbox_id
    bundles = node.tmp / "state" / "bundles"
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(node.create, sid, pod, "victim", SLEEP)
        deadline = time.monotonic() + 10
        while len(list(bundles.iterdir())) < 2:  # the infra's bundle, then the container's
            assert time.monotonic() < deadline
            time.sleep(0.02)
        node.proc.kill()  # kill -9 in the middle of CreateContainer
        with pytest.raises(grpc.RpcError):
            pending.result(timeout=30)
    cid = next(b.name for b in bundles.iterdir() if b.name != sid)
    time.sleep(2.5)  # let the orphaned `runc create` finish: a real, created container
    node.start()
    assert not node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers
    deadline = time.monotonic() + 30  # removed by the recheck, after the socket serves
    while (bundles / cid).exists():
        assert time.monotonic() < deadline, "the half-created container was never removed"
        time.sleep(0.05)
    assert not (node.tmp / "root" / "snapshots" / cid).exists()
    assert cid not in Path("/proc/mounts").read_text()
    node.run(sid, pod, "victim", SLEEP)  # the name is free again
