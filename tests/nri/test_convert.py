"""What plugins are told: pods and containers as NRI messages, and Synchronize in parts."""

from __future__ import annotations

import pytest

from pycri.api import api_pb2 as pb
from pycri.nri import adaptation, convert
from pycri.nri.api import api_pb2 as api
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox


def _pod() -> Sandbox:
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="web", namespace="prod", uid="u1"),
        labels={"app": "web"}, annotations={"a": "b"},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent="/kubepods/pod1",
            resources=pb.LinuxContainerResources(cpu_shares=1024, memory_limit_in_bytes=1 << 30,
                                                 cpuset_cpus="0-1")))
    return Sandbox(id="p1", config=config, handler="crun", runtime_handler="", created_at=1,
                   state=pb.SANDBOX_READY, netns="/run/netns/pycri-p1", ips=["10.0.0.5"],
                   infra_pid=42, cgroup_parent="/kubepods/pod1")


def test_pod_sandbox() -> None:
    msg = convert.pod_sandbox(_pod())
    assert (msg.id, msg.name, msg.namespace, msg.uid) == ("p1", "web", "prod", "u1")
    assert dict(msg.labels) == {"app": "web"} and dict(msg.annotations) == {"a": "b"}
    assert msg.runtime_handler == "crun" and msg.pid == 42 and list(msg.ips) == ["10.0.0.5"]
    assert msg.linux.cgroup_parent == "/kubepods/pod1"
    assert [(n.type, n.path) for n in msg.linux.namespaces] == [("network",
                                                                 "/run/netns/pycri-p1")]
    r = msg.linux.pod_resources
    assert (r.cpu.shares.value, r.memory.limit.value, r.cpu.cpus) == (1024, 1 << 30, "0-1")
    assert not msg.linux.HasField("pod_overhead")


SPEC = {
    "process": {
        "args": ["/bin/sh", "-c", "true"], "env": ["PATH=/bin", "A=1"],
        "user": {"uid": 1000, "gid": 1000, "additionalGids": [2000]},
        "rlimits": [{"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 4096}],
        "oomScoreAdj": 500, "ioPriority": {"class": "IOPRIO_CLASS_BE", "priority": 4},
    },
    "mounts": [{"destination": "/data", "type": "bind", "source": "/srv",
                "options": ["rbind", "ro"]}],
    "hooks": {"prestart": [{"path": "/bin/hook", "args": ["hook"], "timeout": 5}]},
    "annotations": {"x": "y", "io.kubernetes.cri.container-type": "container"},
    "linux": {
        "namespaces": [{"type": "pid"}, {"type": "network", "path": "/run/netns/n"}],
        "cgroupsPath": "/kubepods/pod1/c1",
        "sysctl": {"net.ipv4.ip_forward": "1"},
        "devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229,
                     "fileMode": 0o666}],
        "resources": {"memory": {"limit": 1 << 28, "swap": 1 << 29},
                      "cpu": {"shares": 256, "quota": 50000, "period": 100000,
                              "cpus": "1"},
                      "hugepageLimits": [{"pageSize": "2MB", "limit": 0}],
                      "devices": [{"allow": False, "access": "rwm"}],
                      "pids": {"limit": 100}},
    },
}


def _container(state: int = pb.CONTAINER_UNKNOWN) -> Container:
    config = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                                image=pb.ImageSpec(image="reg/app:1"), labels={"l": "v"},
                                CDI_devices=[pb.CDIDevice(name="vendor.com/gpu=0")])
    return Container(id="c1", sandbox_id="p1", config=config, image_id="sha256:cfg",
                     image_ref="reg/app@sha256:man", handler="runc", created_at=5,
                     log_path="", state=state, pid=77)


def test_container_from_its_spec() -> None:
    msg = convert.container(_container(), SPEC)
    assert (msg.id, msg.pod_sandbox_id, msg.name) == ("c1", "p1", "app")
    assert msg.state == api.CONTAINER_CREATED  # being created
    assert list(msg.args) == ["/bin/sh", "-c", "true"] and list(msg.env) == ["PATH=/bin", "A=1"]
    assert dict(msg.labels) == {"l": "v"} and msg.annotations["x"] == "y"
    assert [(m.destination, m.source, list(m.options)) for m in msg.mounts] == [
        ("/data", "/srv", ["rbind", "ro"])]
    assert msg.hooks.prestart[0].path == "/bin/hook" and msg.hooks.prestart[0].timeout.value == 5
    assert (msg.user.uid, msg.user.gid, list(msg.user.additional_gids)) == (1000, 1000, [2000])
    assert [(r.type, r.soft, r.hard) for r in msg.rlimits] == [("RLIMIT_NOFILE", 1024, 4096)]
    assert [d.name for d in msg.CDI_devices] == ["vendor.com/gpu=0"]
    assert (msg.image.name, msg.image.digest, msg.image.config_digest) == (
        "reg/app:1", "sha256:man", "sha256:cfg")
    linux = msg.linux
    assert [(n.type, n.path) for n in linux.namespaces] == [("pid", ""),
                                                            ("network", "/run/netns/n")]
    assert linux.cgroups_path == "/kubepods/pod1/c1" and linux.oom_score_adj.value == 500
    assert getattr(linux.io_priority, "class") == api.IOPRIO_CLASS_BE
    assert dict(linux.sysctl) == {"net.ipv4.ip_forward": "1"}
    dev = linux.devices[0]
    assert (dev.path, dev.major, dev.minor, dev.file_mode.value) == ("/dev/fuse", 10, 229, 0o666)
    assert not dev.HasField("uid")
    r = linux.resources
    assert (r.memory.limit.value, r.memory.swap.value) == (1 << 28, 1 << 29)
    assert (r.cpu.shares.value, r.cpu.quota.value, r.cpu.period.value, r.cpu.cpus) == (
        256, 50000, 100000, "1")
    assert not r.memory.HasField("reservation")
    assert r.hugepage_limits[0].page_size == "2MB" and r.pids.limit == 100
    assert not r.devices[0].allow and not r.devices[0].HasField("major")


def test_what_is_kept_of_a_spec_describes_the_container_alike() -> None:
    full = {**SPEC, "root": {"path": "/x"},
            "linux": {**SPEC["linux"], "seccomp": {"syscalls": [{"names": ["read"]}] * 100},
                      "maskedPaths": ["/proc/kcore"]}}
    kept = convert.spec_view(full)
    assert "root" not in kept and set(kept["linux"]) == {
        "namespaces", "devices", "resources", "cgroupsPath", "sysctl"}
    assert convert.container(_container(), kept) == convert.container(_container(), full)


def test_states_and_exit_follow_the_record() -> None:
    c = _container(pb.CONTAINER_EXITED)
    c.exit_code, c.reason, c.finished_at = 137, "OOMKilled", 9
    msg = convert.container(c, {})
    assert msg.state == api.CONTAINER_STOPPED
    assert (msg.exit_code, msg.status_reason, msg.finished_at, msg.pid) == (137, "OOMKilled",
                                                                           9, 77)
    c.state = pb.CONTAINER_RUNNING
    convert.refresh(msg, c)
    assert msg.state == api.CONTAINER_RUNNING


def test_synchronize_is_sent_in_parts_under_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    pods = [api.PodSandbox(id=f"p{i}", annotations={"a": "x" * 1000}) for i in range(50)]
    ctrs = [api.Container(id=f"c{i}", env=["E=" + "y" * 1000]) for i in range(50)]
    monkeypatch.setattr(adaptation, "SYNC_CHUNK_BYTES", 10_000)
    parts = list(adaptation._sync_parts(pods, ctrs))
    assert len(parts) > 5
    assert all(p.more for p in parts[:-1]) and not parts[-1].more
    assert all(p.ByteSize() <= 10_000 + 1100 for p in parts)
    assert [q.id for p in parts for q in p.pods] == [q.id for q in pods]
    assert [c.id for p in parts for c in p.containers] == [c.id for c in ctrs]
    assert [p.more for p in adaptation._sync_parts([], [])] == [False]
