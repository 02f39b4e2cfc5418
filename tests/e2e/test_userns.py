"""Pods with their own user namespace (NamespaceOption.userns_options, `hostUsers: false`)
end to end with runc and crun: one namespace for the infra and every container, files
owned by the mapped IDs without chowned layers, idmapped volumes, the refusals, a kill -9
of pycri, and nothing left mounted afterwards."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.lib import images
from tests.lib.registry import Registry
from tests.streaming import client

pytestmark = pytest.mark.e2e

SLEEP = ["sleep", "1000"]
HANDLERS = ["runc", "crun"]
LENGTH = 65536


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """pytest's tmp dirs are 0700, and the OCI runtime reaches a user-namespaced rootfs as
    the pod's (unprivileged) root through <state>: these nodes live under a 0711 dir."""
    base = Path("/var/tmp") / f"pycri-userns-{secrets.token_hex(4)}"
    base.mkdir(mode=0o711)
    yield base
    with open("/proc/mounts") as f:
        if not any(str(base) in line.split()[1] for line in f):
            shutil.rmtree(base, ignore_errors=True)


def host_base() -> int:
    """A 65536-aligned host range of its own for each pod, as the kubelet allocates."""
    return LENGTH * (16 + secrets.randbelow(4096))


def userns(host: int, length: int = LENGTH, mode: int = pb.POD) -> pb.NamespaceOption:
    m = pb.IDMapping(container_id=0, host_id=host, length=length)
    return pb.NamespaceOption(userns_options=pb.UserNamespace(mode=mode, uids=[m], gids=[m]))


def maps(host: int) -> dict[str, list[pb.IDMapping]]:
    m = pb.IDMapping(container_id=0, host_id=host, length=LENGTH)
    return {"uidMappings": [m], "gidMappings": [m]}


def run_pod(node: Node, name: str, ns: pb.NamespaceOption, handler: str = "",
            **kw: object) -> tuple[str, pb.PodSandboxConfig]:
    sc = pb.LinuxSandboxSecurityContext(namespace_options=ns, **kw)  # type: ignore[arg-type]
    cfg = node.pod_config(name, linux=pb.LinuxPodSandboxConfig(security_context=sc))
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=cfg, runtime_handler=handler)).pod_sandbox_id
    return sid, cfg


def container_ns(cfg: pb.PodSandboxConfig) -> pb.LinuxContainerConfig:
    """What the kubelet sends: the pod's namespace options again."""
    return pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        namespace_options=cfg.linux.security_context.namespace_options))


def wait_exited(node: Node, cid: str, timeout: float = 30) -> pb.ContainerStatus:
    deadline = time.monotonic() + timeout
    while (st := node.status(cid)).state != pb.CONTAINER_EXITED:
        assert time.monotonic() < deadline, st
        time.sleep(0.1)
    return st


def output(node: Node, cid: str) -> str:
    """The container's stdout from its CRI log (lines `<time> stdout F <text>`)."""
    text = Path(node.status(cid).log_path).read_text()
    return "".join(line.split(" ", 3)[3] + "\n" for line in text.splitlines() if line)


def host_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


def idmapped_mounts(node: Node) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if str(node.tmp) in line and
                ("idmapped" in line.split(" - ")[0] or "nsfs" in line)]


def test_status_advertises_user_namespaces_for_every_handler(node: Node) -> None:
    resp = node.cri.runtime.Status(pb.StatusRequest(verbose=True))
    features = {h.name: h.features.user_namespaces for h in resp.runtime_handlers}
    assert features == {"": True, "runc": True, "crun": True}


@pytest.mark.parametrize("handler", HANDLERS)
def test_pod_mode_one_user_namespace_owned_rootfs_and_pod_files(
    node: Node, handler: str
) -> None:
    host = host_base()
    sid, cfg = run_pod(node, f"userns-{handler}", userns(host), handler)
    linux = container_ns(cfg)
    a = node.run(sid, cfg, "a", SLEEP, linux=linux)
    b = node.run(sid, cfg, "b", SLEEP, linux=linux)
    assert node.exec(a, "cat", "/proc/self/uid_map").stdout.split() == [
        b"0", str(host).encode(), b"65536"]
    assert node.exec(a, "cat", "/proc/self/gid_map").stdout.split() == [
        b"0", str(host).encode(), b"65536"]
    # Both containers are in the one pinned namespace, which the infra holds.
    ns_a = node.exec(a, "readlink", "/proc/self/ns/user").stdout.strip()
    ns_b = node.exec(b, "readlink", "/proc/self/ns/user").stdout.strip()
    pin = node.tmp / "state" / "sandboxes" / sid / "userns"
    assert ns_a == ns_b == f"user:[{os.stat(pin).st_ino}]".encode()
    verbose = node.cri.runtime.PodSandboxStatus(
        pb.PodSandboxStatusRequest(pod_sandbox_id=sid, verbose=True)).info["info"]
    infra = json.loads(verbose)["pid"]
    assert os.stat(f"/proc/{infra}/ns/user").st_ino == os.stat(pin).st_ino
    # Container root is the mapped host ID; the network namespace is the pod's own.
    info = node.cri.runtime.ContainerStatus(
        pb.ContainerStatusRequest(container_id=a, verbose=True)).info["info"]
    pid = int(json.loads(info)["pid"])
    assert host_uid(pid) == host
    assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/pycri-{sid}").st_ino
    ip = node.exec(a, "ip", "-4", "addr", "show", "eth0").stdout
    assert node.subnet.rsplit(".", 2)[0].encode() in ip  # CNI configured it

    # Image files and pod files appear owned by root, and root may write where it expects.
    owners = node.exec(a, "stat", "-c", "%u:%g %n", "/bin/busybox", "/", "/etc/hosts",
                       "/etc/hostname", "/etc/resolv.conf", "/dev/shm")
    assert owners.exit_code == 0, owners.stderr
    assert all(line.startswith("0:0 ") for line in owners.stdout.decode().splitlines()), owners
    for cmd in ("echo x >> /etc/hosts", "echo y > /dev/shm/z", "touch /new",
                "mkdir -p /tmp/t && touch /tmp/t/f", "echo z >> /etc/passwd"):
        r = node.exec(a, "sh", "-c", cmd)
        assert r.exit_code == 0, (cmd, r.stderr)
    assert node.exec(b, "cat", "/dev/shm/z").stdout == b"y\n"  # one /dev/shm per pod
    # sysfs, /proc, mqueue and cgroup mounts are there and usable.
    mounted = node.exec(a, "sh", "-c", "ls /sys/class/net && ls /dev/mqueue && "
                        "ls /sys/fs/cgroup && cat /proc/self/status").stdout
    assert b"eth0" in mounted and b"Uid:\t0" in mounted

    # Outside: what root wrote belongs to the mapped ID; the image layer was not chowned.
    upper = node.tmp / "root" / "snapshots" / a / "upper"
    assert os.stat(upper / "new").st_uid == host and os.stat(upper).st_uid == host
    layer_busybox = next((node.tmp / "root" / "layers").glob("*/bin/busybox"))
    assert os.stat(layer_busybox).st_uid == 0
    assert os.stat(node.tmp / "root" / "sandboxes" / sid / "hosts").st_uid == host



def test_host_path_with_and_without_idmap(node: Node) -> None:
    host = host_base()
    secret = node.tmp / "secret"
    secret.mkdir()
    (secret / "key").write_text("host root only\n")
    os.chmod(secret / "key", 0o600)
    sid, cfg = run_pod(node, "userns-hostpath", userns(host))
    cid = node.run(sid, cfg, "c", SLEEP, linux=container_ns(cfg), mounts=[
        pb.Mount(container_path="/plain", host_path=str(secret)),
        pb.Mount(container_path="/mapped", host_path=str(secret), **maps(host)),  # type: ignore[arg-type]
        pb.Mount(container_path="/dev/termination-log", host_path=str(secret / "key"),
                 **maps(host)),  # type: ignore[arg-type]  # a file, as the kubelet mounts
    ])
    plain = node.exec(cid, "cat", "/plain/key")
    assert plain.exit_code != 0 and b"Permission denied" in plain.stderr
    assert node.exec(cid, "stat", "-c", "%u", "/plain/key").stdout == b"65534\n"
    # Root holds CAP_DAC_OVERRIDE, CAP_FOWNER and CAP_CHOWN, but only over its namespace.
    for cmd in (["chmod", "644", "/plain/key"], ["chown", "0:0", "/plain/key"]):
        r = node.exec(cid, *cmd)
        assert r.exit_code != 0 and b"Operation not permitted" in r.stderr, (cmd, r)
    assert os.stat(secret / "key").st_mode & 0o777 == 0o600
    mapped = node.exec(cid, "cat", "/mapped/key")
    assert (mapped.exit_code, mapped.stdout) == (0, b"host root only\n")
    assert node.exec(cid, "cat", "/dev/termination-log").stdout == b"host root only\n"
    assert node.exec(cid, "sh", "-c", "echo w > /mapped/new").exit_code == 0
    assert os.stat(secret / "new").st_uid == 0  # written through the mapping: host root's
    assert idmapped_mounts(node) == [
        line for line in idmapped_mounts(node) if "nsfs" in line]  # staged copies dropped
    assert node.exec(cid, "cat", "/proc/self/uid_map").exit_code == 0


def test_node_mode_is_the_host_namespace(node: Node) -> None:
    sid, cfg = run_pod(node, "userns-node",
                       pb.NamespaceOption(userns_options=pb.UserNamespace(mode=pb.NODE)))
    cid = node.run(sid, cfg, "c", ["cat", "/proc/self/uid_map"], linux=container_ns(cfg))
    wait_exited(node, cid)
    assert output(node, cid).split() == Path("/proc/self/uid_map").read_text().split()


@pytest.mark.parametrize(("ns", "privileged", "message"), [
    (pb.NamespaceOption(userns_options=pb.UserNamespace(mode=pb.CONTAINER)), False,
     "not supported"),
    (pb.NamespaceOption(userns_options=pb.UserNamespace(mode=pb.TARGET)), False,
     "not supported"),
    (pb.NamespaceOption(userns_options=pb.UserNamespace(
        mode=pb.POD, uids=[pb.IDMapping(host_id=1000, length=100000)] * 2,
        gids=[pb.IDMapping(host_id=1000, length=100000)] * 2)), False, "exactly one"),
    (pb.NamespaceOption(userns_options=pb.UserNamespace(
        mode=pb.POD, uids=[pb.IDMapping(container_id=1, host_id=1000, length=100000)],
        gids=[pb.IDMapping(container_id=1, host_id=1000, length=100000)])), False,
     "container ID 0"),
    (pb.NamespaceOption(userns_options=pb.UserNamespace(
        mode=pb.POD, uids=[pb.IDMapping(host_id=1000, length=100000)],
        gids=[pb.IDMapping(host_id=1000, length=65536)])), False, "same shape"),
    (userns(LENGTH * 20), True, "privileged"),
    (pb.NamespaceOption(network=pb.NODE, userns_options=userns(LENGTH * 20).userns_options),
     False, "network"),
])
def test_refusals_name_the_problem_and_create_nothing(
    node: Node, ns: pb.NamespaceOption, privileged: bool, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as e:
        run_pod(node, "userns-bad", ns, privileged=privileged)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (e.value.details() or ""), e.value.details()
    assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
    assert not list((node.tmp / "root" / "sandboxes").glob("*"))  # refused at the gate


def test_a_handler_without_support_is_refused_and_the_name_stays_free(node: Node) -> None:
    """A handler whose runtime is too old for user namespaces refuses such a pod with
    FailedPrecondition, creates nothing, and a retry under the same name (on a handler
    that can) is not AlreadyExists."""
    node.add_runtime("oldrunc", '#!/bin/sh\n'
                     'if [ "$1" = --version ]; then echo "runc version 1.0.0"; exit 0; fi\n'
                     'exec runc "$@"\n')
    with pytest.raises(grpc.RpcError) as e:
        run_pod(node, "userns-retry", userns(host_base()), handler="oldrunc")
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
    assert "'oldrunc' cannot run pods with their own user namespace" in (e.value.details() or "")
    assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
    sid, _ = run_pod(node, "userns-retry", userns(host_base()), handler="runc")
    assert node.cri.runtime.PodSandboxStatus(
        pb.PodSandboxStatusRequest(pod_sandbox_id=sid)).status.state == pb.SANDBOX_READY


def test_idmapped_mount_needs_the_pods_mappings(node: Node) -> None:
    host = host_base()
    sid, cfg = run_pod(node, "userns-othermap", userns(host))
    with pytest.raises(grpc.RpcError) as e:
        node.create(sid, cfg, "c", SLEEP, linux=container_ns(cfg), mounts=[
            pb.Mount(container_path="/m", host_path=str(node.tmp), **maps(host + LENGTH)),  # type: ignore[arg-type]
        ])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "pod's user namespace mappings" in (e.value.details() or "")
    with pytest.raises(grpc.RpcError) as e:  # /proc is below it: nothing there can be idmapped
        node.create(sid, cfg, "c", SLEEP, linux=container_ns(cfg), mounts=[
            pb.Mount(container_path="/m", host_path="/", readonly=True, **maps(host)),  # type: ignore[arg-type]
        ])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot be idmapped" in (e.value.details() or "")
    outside = pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        namespace_options=cfg.linux.security_context.namespace_options,
        run_as_user=pb.Int64Value(value=LENGTH)))
    with pytest.raises(grpc.RpcError) as e:
        node.create(sid, cfg, "c", SLEEP, linux=outside)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not mapped" in (e.value.details() or "")
    assert not node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers


@pytest.mark.parametrize("handler", HANDLERS)
def test_kill_9_keeps_the_pod_and_remove_leaves_no_mount(node: Node, handler: str) -> None:
    host = host_base()
    sid, cfg = run_pod(node, "userns-crash", userns(host), handler)
    cid = node.run(sid, cfg, "c", SLEEP, linux=container_ns(cfg))
    node.restart(signal.SIGKILL)
    assert node.pod_status(sid).state == pb.SANDBOX_READY
    assert node.status(cid).state == pb.CONTAINER_RUNNING
    assert node.exec(cid, "cat", "/proc/self/uid_map").stdout.split()[1] == str(host).encode()
    # A second container after the restart joins the same namespace.
    cid2 = node.run(sid, cfg, "d", SLEEP, linux=container_ns(cfg))
    assert node.exec(cid2, "readlink", "/proc/self/ns/user").stdout == node.exec(
        cid, "readlink", "/proc/self/ns/user").stdout
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    assert idmapped_mounts(node) == []
    assert not (node.tmp / "state" / "rro").exists() or not list(
        (node.tmp / "state" / "rro").iterdir())


def test_image_volume_with_and_without_idmap(node: Node) -> None:
    host = host_base()
    sid, cfg = run_pod(node, "userns-imgvol", userns(host))
    image = pb.ImageSpec(image=node.image)
    cid = node.run(sid, cfg, "c", SLEEP, linux=container_ns(cfg), mounts=[
        pb.Mount(container_path="/img", readonly=True, image=image),
        pb.Mount(container_path="/img-mapped", readonly=True, image=image, **maps(host)),  # type: ignore[arg-type]
    ])
    owners = node.exec(cid, "stat", "-c", "%u", "/img/bin/busybox", "/img-mapped/bin/busybox")
    assert owners.stdout.split() == [b"65534", b"0"]
    assert node.exec(cid, "touch", "/img-mapped/x").exit_code != 0  # still read-only


FAILING_CREATE = """#!/bin/sh
for a in "$@"; do last=$a; done
echo "$last" >> {mark}.ids
for a in "$@"; do
  if [ "$a" = create ] && [ -e {mark} ]; then echo "injected create failure" >&2; exit 1; fi
done
exec /usr/sbin/runc "$@"
"""


def test_failed_creates_undo_namespaces_and_mounts(node: Node) -> None:
    mark = node.tmp / "fail-create"
    node.add_runtime("failing", FAILING_CREATE.format(mark=mark))
    host = host_base()
    mark.touch()
    with pytest.raises(grpc.RpcError) as e:
        run_pod(node, "userns-fail", userns(host), "failing")
    assert "injected create failure" in (e.value.details() or "")
    assert not node.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items
    assert idmapped_mounts(node) == []
    tried = Path(f"{mark}.ids").read_text().split()  # the infra's ID is the pod's
    assert tried and not [i for i in tried if os.path.exists(f"/run/netns/pycri-{i}")]
    assert not list((node.tmp / "state" / "rootfs").iterdir())

    mark.unlink()
    sid, cfg = run_pod(node, "userns-fail2", userns(host), "failing")
    pod_mounts = idmapped_mounts(node)  # the pod's pinned namespaces
    (node.tmp / "vol").mkdir()
    mark.touch()
    with pytest.raises(grpc.RpcError) as e:
        node.create(sid, cfg, "c", SLEEP, linux=container_ns(cfg), mounts=[
            pb.Mount(container_path="/m", host_path=str(node.tmp / "vol"), **maps(host)),  # type: ignore[arg-type]
            pb.Mount(container_path="/img", readonly=True, image=pb.ImageSpec(image=node.image),
                     **maps(host)),  # type: ignore[arg-type]
        ])
    assert "injected create failure" in (e.value.details() or "")
    assert not node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers
    assert idmapped_mounts(node) == pod_mounts
    assert sorted(p.name for p in (node.tmp / "state" / "rootfs").iterdir()) == [sid]
    assert not list((node.tmp / "state" / "rro").iterdir())
    with open("/proc/mounts") as f:
        assert not [line for line in f if str(node.tmp / "root" / "snapshots") in line]


def test_port_forward_and_streaming_exec_reach_the_pod(node: Node) -> None:
    """Port-forward dials from a thread that enters the pod's network namespace, which the
    pod's user namespace owns; the streaming exec joins that user namespace."""
    sid, cfg = run_pod(node, "userns-pf", userns(host_base()))
    web = ["sh", "-c", "mkdir -p /www && echo hi-from-userns > /www/index.html && "
           "exec httpd -f -p 8080 -h /www"]
    cid = node.run(sid, cfg, "web", web, linux=container_ns(cfg))
    request = b"GET /index.html HTTP/1.0\r\n\r\n"
    deadline = time.monotonic() + 10
    while True:
        url = node.cri.runtime.PortForward(pb.PortForwardRequest(pod_sandbox_id=sid)).url
        reply, error = asyncio.run(client.forward_once(url, 8080, request))
        if reply or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # httpd not listening yet
    assert b"hi-from-userns" in reply, (reply, error)
    url = node.cri.runtime.Exec(pb.ExecRequest(container_id=cid, cmd=["id", "-u"],
                                               stdout=True, stderr=True)).url
    out = asyncio.run(client.run(url, timeout=15))
    assert out.stdout == b"0\n" and out.status["status"] == "Success", out


def test_pause_image_infra_in_the_pods_user_namespace(node: Node, registry: Registry) -> None:
    pause = images.push_busybox(registry.addr, node.tmp / "layout", name="pause", tag="userns",
                                entrypoint=["/bin/sleep"], cmd=["1000000"])
    cfg = node.proc.config
    cfg.write_text(f'pause_image = "{pause}"\n' + cfg.read_text())
    node.restart()
    host = host_base()
    sid, pod = run_pod(node, "userns-pause", userns(host))
    info = json.loads(node.cri.runtime.PodSandboxStatus(
        pb.PodSandboxStatusRequest(pod_sandbox_id=sid, verbose=True)).info["info"])
    deadline = time.monotonic() + 30
    while b"sleep" not in Path(f"/proc/{info['pid']}/cmdline").read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert host_uid(info["pid"]) == host
    cid = node.run(sid, pod, "c", SLEEP, linux=container_ns(pod))
    assert node.exec(cid, "stat", "-c", "%u", "/bin/busybox").stdout == b"0\n"
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    assert not list((node.tmp / "root" / "snapshots").glob("*"))
    assert idmapped_mounts(node) == []


def test_a_one_id_namespace_runs(node: Node) -> None:
    """Without gid 5 mapped the kernel refuses devpts' gid=5, which pycri then leaves out."""
    host = host_base()
    sid, cfg = run_pod(node, "userns-tiny", userns(host, 1))
    cid = node.run(sid, cfg, "c", SLEEP, linux=container_ns(cfg))
    assert node.exec(cid, "cat", "/proc/self/uid_map").stdout.split() == [
        b"0", str(host).encode(), b"1"]
