"""Checkpoint/restore end to end, with the criu binary of PYCRI_TEST_CRIU (else `criu` on
PATH). Where its `criu check` passes, a counting container is checkpointed, its archive
read back with tarfile, and restored into a new pod (by CreateContainer from the archive,
and by RestorePod from a pod archive), where it must count on from the checkpointed
value. Where CRIU cannot work every checkpoint RPC answers FailedPrecondition naming
what is missing; bad requests are refused and change nothing, on any host."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from pycri.api import api_pb2 as pb
from pycri.oci.seccomp import default_profile
from pycri.oci.spec.capabilities import ALL_CAPABILITIES
from tests.e2e.conftest import CRIU, Node
from tests.lib import hostile_checkpoints, images, seccomp_filters, tools
from tests.lib.criu_images import ALLOW_ALL, write_core, write_seccomp
from tests.lib.registry import Registry

pytestmark = pytest.mark.e2e

COUNTER = ["sh", "-c", "i=0; while true; do echo $i > /tmp/c; i=$((i+1)); sleep 0.1; done"]
# checkpointctl, where there is one (PYCRI_TEST_CHECKPOINTCTL, else on PATH), must read
# the archive.
CHECKPOINTCTL = tools.find("checkpointctl")
needs_criu = tools.needs("criu", "checkpoint/restore with CRIU")


def refused(call: Callable[[Any], Any], request: Any, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as e:
        call(request)
    assert e.value.code() == code, e.value.details()
    return str(e.value.details())


def criu_stand_in(node: Node, *, restore_from_images: bool = False) -> None:
    """A criu that answers only the probe (`criu check` passes), so the checkpoint RPCs
    get past it on hosts whose CRIU cannot work; nothing here ever reaches CRIU itself.
    Takes effect at the next restart."""
    stand_in = node.tmp / "criu-probe"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    node.proc.config.write_text(node.proc.config.read_text().replace(
        f'criu = "{CRIU}"', f'criu = "{stand_in}"'))
    if restore_from_images:
        allow_image_restores(node)


def allow_image_restores(node: Node) -> None:
    """`checkpoint.restore_from_images` on, from the next restart."""
    node.proc.config.write_text(node.proc.config.read_text().replace(
        "[checkpoint]\n", "[checkpoint]\nrestore_from_images = true\n"))


def fake_checkpoints(node: Node, images: Path) -> None:
    """Runtime handler "fakeckpt": runc, except that its `checkpoint` copies the CRIU
    images in `images` (made by crit) instead of dumping, and its `restore` fails as
    CRIU would on such images. With `criu_stand_in`, checkpoints and restores run their
    whole course in pycri on any host. Restarts the daemon."""
    node.add_runtime("fakeckpt", f"""#!/bin/sh
for a in "$@"; do [ "$a" = --help ] && exec /usr/sbin/runc "$@"; done
prev=
for a in "$@"; do
    [ "$prev" = --image-path ] && dest="$a"
    [ "$a" = restore ] && {{ echo "restore: CRIU cannot work here" >&2; exit 1; }}
    prev="$a"
done
for a in "$@"; do
    [ "$a" = checkpoint ] && {{ cp -r {images}/. "$dest"/ && exit 0; exit 1; }}
done
exec /usr/sbin/runc "$@"
""")


def confined(node: Node, name: str) -> pb.ContainerConfig:
    """What the attacker's request asks for: uid 1000, no capability, RuntimeDefault
    seccomp, no mount."""
    config = node.container_config(name, ["sleep", "3600"])
    sc = config.linux.security_context
    sc.run_as_user.value = 1000
    sc.capabilities.drop_capabilities.append("ALL")
    sc.seccomp.profile_type = pb.SecurityProfile.RuntimeDefault
    return config


def container_json(node: Node, **linux: Any) -> bytes:
    """A pycri.container.json; `linux` goes into the config's security context, a
    `mounts` key into its mounts."""
    mounts = linux.pop("mounts", [])
    config = {"metadata": {"name": "evil"}, "image": {"image": node.image},
              "command": ["sleep", "3600"], "mounts": mounts,
              "linux": {"securityContext": linux}}
    return json.dumps({"version": 1, "config": config, "image_id": ""}).encode()


# What the hostile checkpoint of the issue claims for itself.
PRIVILEGED = {"runAsUser": {"value": "0"}, "capabilities": {"addCapabilities": ["ALL"]},
              "seccomp": {"profileType": "Unconfined"}}
HOST_ROOT = [{"containerPath": "/host", "hostPath": "/"}]


def checkpoint_source(node: Node, registry: Registry, via: str, name: str, doc: bytes,
                      core: Path) -> str:
    """A checkpoint layout (`doc` as pycri.container.json, `core` as CRIU's only process
    image, with the seccomp.img beside it if there is one) as an archive in the archive
    dir or as a pulled image marked as a checkpoint; the reference CreateContainer takes
    for it."""
    entries = [images.file("pycri.container.json", doc), images.directory("checkpoint"),
               *(images.file(f"checkpoint/{f.name}", f.read_bytes())
                 for f in (core, core.parent / "seccomp.img") if f.exists())]
    if via == "archive":
        path = archives(node) / f"{name}.tar"
        path.write_bytes(images.tar_bytes(entries))
        return str(path)
    ref = images.push_image(registry.addr, node.tmp / f"layout-{name}", name, "v1", [
        images.ImageSpec(layers=[entries], annotations={
            "org.criu.checkpoint.container.name": "evil"})])
    node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)))
    return ref


def count(node: Node, cid: str) -> int:
    """The counter's value; read again if caught between the truncate and the write."""
    for _ in range(50):
        if out := node.exec(cid, "cat", "/tmp/c").stdout.strip():
            return int(out)
    raise AssertionError("/tmp/c stays empty")


def archives(node: Node) -> Path:
    return node.tmp / "archives"


def counting(node: Node, name: str) -> tuple[str, str]:
    """A pod with the counter running, counted past 10 (a restart from 0 cannot pass for
    a restore)."""
    sid, pod = node.run_pod(name)
    cid = node.run(sid, pod, "counter", COUNTER)
    deadline = time.monotonic() + 30
    while count(node, cid) < 10:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    return sid, cid


def assert_counts_on(node: Node, cid: str, checkpointed: int) -> None:
    """The restored counter runs on from the checkpointed value (its memory came back)."""
    assert node.status(cid).state == pb.CONTAINER_RUNNING
    first = count(node, cid)
    assert first >= checkpointed
    deadline = time.monotonic() + 10
    while count(node, cid) <= first:
        assert time.monotonic() < deadline, "the restored counter does not count"
        time.sleep(0.2)


def container_layout(tar: tarfile.TarFile, prefix: str = "") -> tuple[dict[str, Any], int]:
    """Check one container's checkpoint layout in `tar`; (config.dump, the counter's
    value in the rootfs changes)."""
    names = set(tar.getnames())
    for name in ("config.dump", "spec.dump", "rootfs-diff.tar", "dump.log", "status",
                 "pycri.container.json", "checkpoint/inventory.img", "checkpoint/pstree.img"):
        assert prefix + name in names, sorted(names)
    assert any(n.startswith(prefix + "checkpoint/pages-") for n in names)

    def read(name: str) -> bytes:
        f = tar.extractfile(prefix + name)
        assert f is not None
        return f.read()

    config = json.loads(read("config.dump"))
    spec = json.loads(read("spec.dump"))
    assert spec["annotations"]["io.kubernetes.cri.container-name"] == "counter"
    with tarfile.open(fileobj=tar.extractfile(prefix + "rootfs-diff.tar")) as diff:
        f = diff.extractfile("tmp/c")
        assert f is not None
        return config, int(f.read())


@needs_criu
def test_a_checkpointed_counter_keeps_counting_in_a_new_pod(node: Node) -> None:
    rt = node.cri.runtime
    sid, cid = counting(node, "ckpt-src")
    archive = archives(node) / "counter.tar"
    rt.CheckpointContainer(pb.CheckpointContainerRequest(container_id=cid,
                                                         location=str(archive), timeout=120))
    assert node.status(cid).state == pb.CONTAINER_RUNNING  # left running
    assert count(node, cid) >= 10
    with tarfile.open(archive) as tar:
        config, checkpointed = container_layout(tar)
    assert config["id"] == cid and config["name"] == "counter" and config["runtime"] == "runc"
    assert config["rootfsImage"] == node.image
    assert config["rootfsImageRef"].startswith("sha256:")
    assert checkpointed >= 10
    assert [p.name for p in archives(node).iterdir()] == ["counter.tar"]  # nothing partial
    if CHECKPOINTCTL:  # checkpointctl reads it as it reads CRI-O's and containerd's
        shown = subprocess.run([CHECKPOINTCTL, "show", str(archive)], capture_output=True,
                               text=True, timeout=60, check=True).stdout
        assert "counter" in shown and cid[:12] in shown and node.image in shown, shown
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))

    new_sid, new_pod = node.run_pod("ckpt-dst")
    restored = node.container_config("counter-restored", [])
    restored.image.image = str(archive)
    new_cid = rt.CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=new_sid, config=restored, sandbox_config=new_pod)).container_id
    status = node.status(new_cid)
    assert status.state == pb.CONTAINER_CREATED
    assert status.metadata.name == "counter-restored"  # the request's name
    assert status.image.image == node.image
    node.restart()  # a container waiting for its restore stays CREATED across a restart
    rt = node.cri.runtime
    assert node.status(new_cid).state == pb.CONTAINER_CREATED
    rt.StartContainer(pb.StartContainerRequest(container_id=new_cid))
    assert_counts_on(node, new_cid, checkpointed)

    # Its exit is handled like any container's.
    rt.StopContainer(pb.StopContainerRequest(container_id=new_cid, timeout=0))
    status = node.status(new_cid)
    assert status.state == pb.CONTAINER_EXITED and status.exit_code == 137


@needs_criu
def test_an_image_holding_a_checkpoint_restores_like_the_archive(
    node: Node, registry: Registry
) -> None:
    """The archive's files as an OCI image's layer, marked as `checkpointctl build` marks
    it: pulled like any image, created from like the archive."""
    rt = node.cri.runtime
    sid, cid = counting(node, "img-src")
    archive = archives(node) / "counter.tar"
    rt.CheckpointContainer(pb.CheckpointContainerRequest(container_id=cid,
                                                         location=str(archive)))
    with tarfile.open(archive) as tar:
        _, checkpointed = container_layout(tar)
        layer = [images.directory(m.name) if m.isdir() else
                 images.file(m.name, tar.extractfile(m).read())  # type: ignore[union-attr]
                 for m in tar.getmembers()]
    ref = images.push_image(registry.addr, node.tmp / "layout", "counter-checkpoint", "v1", [
        images.ImageSpec(layers=[layer], annotations={
            "org.criu.checkpoint.container.name": "counter"})])
    node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)))
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    allow_image_restores(node)
    node.restart()
    rt = node.cri.runtime

    new_sid, new_pod = node.run_pod("img-dst")
    restored = node.container_config("counter", [])
    restored.image.image = ref
    new_cid = rt.CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=new_sid, config=restored, sandbox_config=new_pod)).container_id
    rt.StartContainer(pb.StartContainerRequest(container_id=new_cid))
    assert_counts_on(node, new_cid, checkpointed)


@needs_criu
def test_a_checkpointed_pod_is_restored_with_its_containers(node: Node) -> None:
    rt = node.cri.runtime
    sid, cid = counting(node, "pod-src")
    archive = archives(node) / "pod.tar"
    rt.CheckpointPod(pb.CheckpointPodRequest(pod_sandbox_id=sid, output_path=str(archive)))
    assert node.status(cid).state == pb.CONTAINER_RUNNING
    with tarfile.open(archive) as tar:
        options = json.load(tar.extractfile("pod.options"))  # type: ignore[arg-type]
        assert options["containers"] == {"counter": cid}
        dumped = json.load(tar.extractfile("pod.dump"))  # type: ignore[arg-type]
        assert dumped["config"]["metadata"]["name"] == "pod-src"
        _, checkpointed = container_layout(tar, f"{cid}/")
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))

    answer = rt.RestorePod(pb.RestorePodRequest(checkpoint_path=str(archive),
                                                config=node.pod_config("pod-dst")))
    assert [c.name for c in answer.restored_containers] == ["counter"]
    new_cid = answer.restored_containers[0].container_id
    assert node.pod_status(answer.pod_sandbox_id).metadata.name == "pod-dst"
    assert node.status(new_cid).metadata.name == "counter"
    assert_counts_on(node, new_cid, checkpointed)


def test_bad_checkpoint_requests_change_nothing(node: Node) -> None:
    rt = node.cri.runtime
    sid, pod = node.run_pod("ckpt-bad")
    cid = node.run(sid, pod, "counter", COUNTER)
    outside = node.tmp / "elsewhere.tar"
    details = refused(rt.CheckpointContainer, pb.CheckpointContainerRequest(
        container_id=cid, location=str(outside)), grpc.StatusCode.INVALID_ARGUMENT)
    assert "is outside the checkpoint directories" in details
    escape = archives(node) / "sub"
    escape.symlink_to(node.tmp)  # a link out of the directory is outside too
    refused(rt.CheckpointContainer, pb.CheckpointContainerRequest(
        container_id=cid, location=str(escape / "x.tar")), grpc.StatusCode.INVALID_ARGUMENT)
    existing = archives(node) / "taken.tar"
    existing.write_text("mine")
    details = refused(rt.CheckpointContainer, pb.CheckpointContainerRequest(
        container_id=cid, location=str(existing)), grpc.StatusCode.ALREADY_EXISTS)
    assert "already exists" in details
    refused(rt.CheckpointPod, pb.CheckpointPodRequest(
        pod_sandbox_id=sid, output_path=str(existing)), grpc.StatusCode.ALREADY_EXISTS)
    refused(rt.CheckpointContainer, pb.CheckpointContainerRequest(
        container_id="0123456789ab", location=str(archives(node) / "c.tar")),
        grpc.StatusCode.NOT_FOUND)
    refused(rt.CheckpointPod, pb.CheckpointPodRequest(
        pod_sandbox_id="0123456789ab", output_path=str(archives(node) / "p.tar")),
        grpc.StatusCode.NOT_FOUND)
    details = refused(rt.CheckpointPod, pb.CheckpointPodRequest(
        pod_sandbox_id=sid, output_path=str(archives(node) / "p.tar"),
        container_ids=["0123456789ab"]), grpc.StatusCode.NOT_FOUND)
    assert "0123456789ab" in details
    refused(rt.RestorePod, pb.RestorePodRequest(
        checkpoint_path=str(archives(node) / "none.tar")), grpc.StatusCode.NOT_FOUND)
    from_outside = node.container_config("restored", [])
    from_outside.image.image = str(outside)
    refused(rt.CreateContainer, pb.CreateContainerRequest(
        pod_sandbox_id=sid, config=from_outside, sandbox_config=pod),
        grpc.StatusCode.INVALID_ARGUMENT)

    # Nothing changed: no file written or replaced, one pod, the counter still counting.
    assert not outside.exists() and existing.read_text() == "mine"
    assert sorted(p.name for p in archives(node).iterdir()) == ["sub", "taken.tar"]
    assert [p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest()).items] == [sid]
    assert [c.id for c in rt.ListContainers(pb.ListContainersRequest()).containers] == [cid]
    before = count(node, cid)
    time.sleep(0.5)
    assert count(node, cid) > before


def test_without_criu_every_checkpoint_rpc_is_a_failed_precondition(node: Node) -> None:
    missing = node.tmp / "no-criu"
    node.proc.config.write_text(node.proc.config.read_text().replace(
        f'criu = "{CRIU}"', f'criu = "{missing}"'))
    node.restart()
    rt = node.cri.runtime
    sid, pod = node.run_pod("ckpt")
    cid = node.run(sid, pod, "counter", COUNTER)
    archive = archives(node) / "counter.tar"
    why = f"checkpoint/restore cannot work on this node: the criu binary {missing} is not there"

    details = refused(rt.CheckpointContainer, pb.CheckpointContainerRequest(
        container_id=cid, location=str(archive)), grpc.StatusCode.FAILED_PRECONDITION)
    assert details.startswith(why)
    details = refused(rt.CheckpointPod, pb.CheckpointPodRequest(
        pod_sandbox_id=sid, output_path=str(archive)), grpc.StatusCode.FAILED_PRECONDITION)
    assert details.startswith(why)
    assert not archive.exists()
    archive.write_bytes(b"")  # an archive to restore from, never opened
    details = refused(rt.RestorePod, pb.RestorePodRequest(
        checkpoint_path=str(archive), config=node.pod_config("restored")),
        grpc.StatusCode.FAILED_PRECONDITION)
    assert details.startswith(why)
    from_archive = node.container_config("restored", [])
    from_archive.image.image = str(archive)
    details = refused(rt.CreateContainer, pb.CreateContainerRequest(
        pod_sandbox_id=sid, config=from_archive, sandbox_config=pod),
        grpc.StatusCode.FAILED_PRECONDITION)
    assert details.startswith(why)

    # Nothing changed: no new pod or container, the counter still counting.
    assert [p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest()).items] == [sid]
    assert [c.id for c in rt.ListContainers(pb.ListContainersRequest()).containers] == [cid]
    assert node.status(cid).state == pb.CONTAINER_RUNNING
    before = count(node, cid)
    time.sleep(0.5)
    assert count(node, cid) > before


def test_a_container_frozen_by_a_checkpoint_is_thawed_after_a_crash(node: Node) -> None:
    """The container is frozen while it is dumped. pycri killed at that moment must thaw it
    at its next start: nothing else ever would, and a frozen container cannot even be
    killed. The dump never reaches CRIU here, on any host: a wrapper runtime holds runc's
    `checkpoint` command (the fault injected) and a stand-in answers the criu probe."""
    held, release = node.tmp / "ckpt-held", node.tmp / "ckpt-release"
    criu_stand_in(node)
    node.add_runtime("heldckpt", f"""#!/bin/sh
for a in "$@"; do [ "$a" = --help ] && exec /usr/sbin/runc "$@"; done
for a in "$@"; do
    if [ "$a" = checkpoint ]; then
        touch {held}
        i=0
        while [ ! -e {release} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
        exit 1
    fi
done
exec /usr/sbin/runc "$@"
""")
    pod = node.pod_config("frozen")
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=pod, runtime_handler="heldckpt")).pod_sandbox_id
    cid = node.run(sid, pod, "counter", COUNTER)

    def runc_status() -> str:
        out = subprocess.run(["/usr/sbin/runc", "--root", str(node.proc.state / "heldckpt"),
                              "state", cid], capture_output=True, text=True, check=True)
        return str(json.loads(out.stdout)["status"])

    def checkpoint() -> None:
        with contextlib.suppress(grpc.RpcError):  # the daemon dies under the call
            node.cri.runtime.CheckpointContainer(pb.CheckpointContainerRequest(
                container_id=cid, location=str(archives(node) / "cut.tar")))

    caller = threading.Thread(target=checkpoint)
    try:
        caller.start()
        deadline = time.monotonic() + 30
        while not held.exists():
            assert time.monotonic() < deadline, "the checkpoint never reached the runtime"
            time.sleep(0.05)
        assert runc_status() == "paused"
        node.restart(signal.SIGKILL)  # waits for the recheck, which thaws it
    finally:
        release.touch()
        caller.join(30)
    assert runc_status() == "running"
    assert not (node.proc.state / "bundles" / cid / "frozen").exists()
    assert_counts_on(node, cid, 0)
    assert "thawed, left frozen by a checkpoint" in node.proc.log_text()
    assert not (archives(node) / "cut.tar").exists()


def test_a_checkpoint_image_restores_only_where_the_operator_allows_it(
    node: Node, registry: Registry
) -> None:
    """Anyone who can push an image can write one that says it is a checkpoint: restoring
    from images is off unless `checkpoint.restore_from_images` is set."""
    criu_stand_in(node)
    node.restart()
    core = write_core(node.tmp / "core", uid=1000)
    ref = checkpoint_source(node, registry, "image", "ckpt-off", container_json(node), core)
    sid, pod = node.run_pod("ckpt-off")
    request = confined(node, "restored")
    request.image.image = ref
    details = refused(node.cri.runtime.CreateContainer, pb.CreateContainerRequest(
        pod_sandbox_id=sid, config=request, sandbox_config=pod),
        grpc.StatusCode.FAILED_PRECONDITION)
    assert "checkpoint.restore_from_images" in details
    assert node.cri.runtime.ListContainers(pb.ListContainersRequest()).containers == []


@pytest.mark.parametrize("via", ["archive", "image"])
def test_the_request_sets_privilege_never_the_checkpoint(
    node: Node, registry: Registry, via: str
) -> None:
    """The escape of issue 22: a checkpoint asking for uid 0, every capability, no
    seccomp and the host's / got all of it whatever the request said. The container gets
    what the request grants, and a checkpoint whose processes had more is refused."""
    criu_stand_in(node, restore_from_images=True)
    node.restart()
    rt = node.cri.runtime
    sid, pod = node.run_pod("ckpt-priv")
    granted = write_core(node.tmp / "granted", uid=1000)  # what the request grants

    def create(name: str, doc: bytes, core: Path) -> str:
        request = confined(node, name)
        request.image.image = checkpoint_source(node, registry, via, name, doc, core)
        return str(rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=sid, config=request, sandbox_config=pod)).container_id)

    cid = create("claims", container_json(node, **PRIVILEGED), granted)
    spec = json.loads((node.proc.state / "bundles" / cid / "config.json").read_text())
    assert spec["process"]["user"]["uid"] == 1000
    assert not any(spec["process"]["capabilities"].values()), spec["process"]["capabilities"]
    assert "seccomp" in spec["linux"]
    assert "/host" not in [m["destination"] for m in spec["mounts"]]

    def refused_create(name: str, doc: bytes, core: Path) -> str:
        with pytest.raises(grpc.RpcError) as e:
            create(name, doc, core)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
        return str(e.value.details())

    details = refused_create("mounts", container_json(node, mounts=HOST_ROOT), granted)
    assert "/host" in details
    root = write_core(node.tmp / "root", uid=0, caps=ALL_CAPABILITIES, seccomp="disabled")
    details = refused_create("root", container_json(node), root)
    assert "uid 0" in details and "CAP_SYS_ADMIN" in details and "seccomp" in details, details
    assert [c.id for c in rt.ListContainers(pb.ListContainersRequest()).containers] == [cid]


def test_a_checkpoint_keeps_its_seccomp_filters_only_where_the_request_has_them(
    node: Node, registry: Registry
) -> None:
    """Issue 39, item 5. The filters of a real runc container under RuntimeDefault, read
    as CRIU reads them when it dumps (ptrace), restore into a container asking for
    RuntimeDefault: runc's program, ENOSYS stub and all, is as strict as the profile.
    The same checkpoint whose filter lets everything through (once only the presence of
    a filter was checked) is refused, and so is runc's real filter under a request with
    a stricter Localhost profile."""
    criu_stand_in(node)
    node.restart()
    rt = node.cri.runtime
    sid, pod = node.run_pod("ckpt-seccomp")
    live = confined(node, "live")
    cid = rt.CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=sid, config=live, sandbox_config=pod)).container_id
    rt.StartContainer(pb.StartContainerRequest(container_id=cid))
    status = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True))
    filters = seccomp_filters.installed(int(json.loads(status.info["info"])["pid"]))
    assert filters, "runc installed no seccomp filter"
    real = write_core(node.tmp / "real", uid=1000, seccomp_filter=0, pid=9)
    write_seccomp(real.parent, filters)  # newest first, each above the next, as CRIU has it

    def create(name: str, core: Path, config: pb.ContainerConfig | None = None) -> str:
        request = config or confined(node, name)
        request.image.image = checkpoint_source(node, registry, "archive", name,
                                                container_json(node), core)
        return str(rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=sid, config=request, sandbox_config=pod)).container_id)

    restored = create("real", real)
    assert restored in [c.id for c in rt.ListContainers(pb.ListContainersRequest()).containers]

    loose = write_core(node.tmp / "loose", uid=1000, pid=9)
    write_seccomp(loose.parent, [ALLOW_ALL])
    with pytest.raises(grpc.RpcError) as e:
        create("loose", loose)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
    assert "core-9.img ran under seccomp filters that let through" in str(e.value.details())

    strict = node.tmp / "profiles" / "no-getpid.json"  # RuntimeDefault less getpid
    strict.parent.mkdir(exist_ok=True)
    profile = default_profile()
    for rule in profile["syscalls"]:
        rule["names"] = [n for n in rule["names"] if n != "getpid"]
    strict.write_text(json.dumps(profile))
    config = confined(node, "stricter")
    config.linux.security_context.seccomp.CopyFrom(pb.SecurityProfile(
        profile_type=pb.SecurityProfile.Localhost, localhost_ref=str(strict)))
    with pytest.raises(grpc.RpcError) as e:
        create("stricter", real, config)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
    assert "getpid on x86_64 (ALLOW, the profile: ERRNO)" in str(e.value.details())
    assert sorted(c.id for c in rt.ListContainers(pb.ListContainersRequest()).containers
                  ) == sorted([cid, restored])


def test_a_pod_with_a_container_from_a_checkpoint_can_always_be_removed(node: Node) -> None:
    """A container made from a checkpoint has no process until its restore: stopping its
    pod waited 30 s for an exit that could never come, and failed, forever. Checkpointed
    (by the fake runtime), restore pending, restore failed: each pod goes."""
    criu_stand_in(node)
    fake_checkpoints(node, write_core(node.tmp / "images", uid=1000).parent)
    rt = node.cri.runtime

    def pod(name: str) -> tuple[str, pb.PodSandboxConfig]:
        config = node.pod_config(name)
        return rt.RunPodSandbox(pb.RunPodSandboxRequest(
            config=config, runtime_handler="fakeckpt")).pod_sandbox_id, config

    sid, config = pod("fake-src")
    source = confined(node, "counter")
    cid = rt.CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=sid, config=source, sandbox_config=config)).container_id
    rt.StartContainer(pb.StartContainerRequest(container_id=cid))
    archive = archives(node) / "fake.tar"
    rt.CheckpointContainer(pb.CheckpointContainerRequest(container_id=cid,
                                                         location=str(archive)))
    assert archive.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in archives(node).iterdir()] == ["fake.tar"]

    for name, start in (("pending", False), ("failed", True)):
        new_sid, new_pod = pod(f"fake-{name}")
        request = confined(node, "counter")
        request.image.image = str(archive)
        new_cid = rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=new_sid, config=request, sandbox_config=new_pod)).container_id
        if start:
            details = refused(rt.StartContainer, pb.StartContainerRequest(
                container_id=new_cid), grpc.StatusCode.UNKNOWN)
            assert "CRIU cannot work here" in details
            assert node.status(new_cid).reason == "StartError"
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=new_sid))
        assert node.status(new_cid).state == pb.CONTAINER_EXITED
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=new_sid))
        assert new_cid not in [c.id for c in rt.ListContainers(
            pb.ListContainersRequest()).containers]
    assert [p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest()).items] == [sid]


@pytest.mark.parametrize("via", ["archive", "image"])
def test_hostile_checkpoints_are_refused_and_change_nothing(
    node: Node, registry: Registry, via: str
) -> None:
    """Issue 22: each layout of the corpus (tests/lib/hostile_checkpoints.py), as an
    archive and as an image, gets its code, never INTERNAL or UNKNOWN, and leaves
    nothing: no container, no work directory, no file outside."""
    criu_stand_in(node, restore_from_images=True)
    node.restart()
    rt = node.cri.runtime
    sid, pod = node.run_pod("hostile")
    escape = Path("/tmp/pycri-escape")
    got = {}
    for name in hostile_checkpoints.NAMES:
        entries = hostile_checkpoints.build(name, node.image, node.tmp / "corpus" / name)
        request = confined(node, "restored")
        try:
            if via == "archive":
                path = archives(node) / f"{name}.tar"
                path.write_bytes(images.tar_bytes(entries))
                request.image.image = str(path)
            else:
                request.image.image = images.push_image(
                    registry.addr, node.tmp / "layouts" / name, f"hostile-{name}", "v1", [
                        images.ImageSpec(layers=[entries], annotations={
                            "org.criu.checkpoint.container.name": name})])
                node.cri.image.PullImage(pb.PullImageRequest(
                    image=pb.ImageSpec(image=request.image.image)))
            rt.CreateContainer(pb.CreateContainerRequest(
                pod_sandbox_id=sid, config=request, sandbox_config=pod))
            got[name] = "OK"
        except grpc.RpcError as e:
            got[name] = f"{e.code().name}: {e.details()}"
    expected = {n: c.name for n, c in hostile_checkpoints.EXPECT.items()}
    assert {n: g.split(":")[0] for n, g in got.items()} == expected, got
    assert rt.ListContainers(pb.ListContainersRequest()).containers == []
    assert list((node.proc.root / "checkpoints").iterdir()) == []
    assert not escape.exists()
    assert [p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest()).items] == [sid]
