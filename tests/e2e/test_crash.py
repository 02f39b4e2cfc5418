"""kill -9 of the daemon at the steps where hack/soak.py's chaos runs found a leak.

Each test leaves on disk exactly what a SIGKILL at that step leaves, restarts the
daemon and checks that the restart (or the next call) cleans it up.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.e2e.conftest import Node
from tests.lib import images
from tests.lib.registry import HoldFront, Registry

pytestmark = pytest.mark.e2e


def test_cni_cache_write_cut_short_by_a_kill_is_pruned_at_restart(node: Node) -> None:
    """A kill between writing `<net>.tmp` and renaming it (the first write of a
    RunPodSandbox, before any plugin ran) left a cache directory with only the .tmp:
    every restart "released" it again and it was never removed (found by a 50-kill chaos run)."""
    sid, _ = node.run_pod("before")  # a real entry, to copy what a write looks like
    cache = node.tmp / "root" / "cni-cache"
    entry = json.loads((cache / sid / "cni-loopback.json").read_text())
    node.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid))
    node.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
    node.proc.kill()
    vanished = secrets.token_hex(32)  # RunPodSandbox's record went with the crash's undo
    (cache / vanished).mkdir()
    entry |= {"containerId": vanished, "result": None}
    (cache / vanished / "cni-loopback.tmp").write_text(json.dumps(entry))
    node.proc.socket.unlink()
    node.start()
    assert not (cache / vanished).exists()
    node.restart(signal.SIGKILL)  # and it stays that way
    assert list(cache.iterdir()) == []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _exec_session(cid: str) -> tuple[int, Path]:
    """(pid of `conmon --exec` for `cid`, its work dir), once the exec'd process runs."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--exec" in argv and cid.encode() in argv and b"--exec-process-spec" in argv:
            work = Path(os.fsdecode(argv[argv.index(b"--exec-process-spec") + 1])).parent
            if (work / "pid").exists() and (work / "pid").read_text().strip():
                return int(d.name), work
    raise LookupError(cid)


def test_exec_sync_cut_short_by_a_kill_leaves_no_process_or_files(node: Node) -> None:
    """kill -9 during an ExecSync left the exec'd process and its `conmon --exec`
    running for good and their work dir (with the container's env) in /tmp; the
    restarted daemon knew nothing of them (found by a 50-kill chaos run)."""
    sid, pod = node.run_pod("execcrash")
    cid = node.run(sid, pod, "c", ["sleep", "100000"])
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(node.exec, cid, "sleep", "100001", timeout=0)
        deadline = time.monotonic() + 20
        while True:
            try:
                conmon, work = _exec_session(cid)
                break
            except LookupError:
                assert time.monotonic() < deadline, "the exec never started"
                time.sleep(0.05)
        exec_pid = int((work / "pid").read_text())
        node.proc.kill()  # kill -9 pycri while the exec runs
        with pytest.raises(grpc.RpcError):
            pending.result(timeout=30)
    assert _alive(exec_pid) and _alive(conmon)
    node.proc.socket.unlink()
    node.start()
    assert not work.exists()
    deadline = time.monotonic() + 10
    while _alive(exec_pid) or _alive(conmon):
        assert time.monotonic() < deadline, "the orphaned exec was left running"
        time.sleep(0.05)
    assert node.status(cid).state == pb.CONTAINER_RUNNING  # only the exec was killed
    assert node.exec(cid, "echo", "ok").stdout == b"ok\n"


def test_start_container_cut_short_after_the_runtime_started_it_is_running(node: Node) -> None:
    """A kill after `runc start` returned but before the record was saved left a
    running container reported CREATED for good (found while checking what the chaos
    runs' StartContainer kills leave behind)."""
    marker = node.tmp / "started"
    node.add_runtime("slowstart", '#!/bin/sh\ncase " $* " in *" start "*)\n'
                     f'  /usr/sbin/runc "$@"; rc=$?; touch {marker}; sleep 3; exit $rc;;\n'
                     'esac\nexec /usr/sbin/runc "$@"\n')
    pod = node.pod_config("slowstart")
    sid = node.cri.runtime.RunPodSandbox(
        pb.RunPodSandboxRequest(config=pod, runtime_handler="slowstart")).pod_sandbox_id
    marker.unlink()  # the infra's start
    cid = node.create(sid, pod, "victim", ["sleep", "100000"])
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(node.cri.runtime.StartContainer,
                              pb.StartContainerRequest(container_id=cid))
        deadline = time.monotonic() + 20
        while not marker.exists():
            assert time.monotonic() < deadline, "the runtime never started the container"
            time.sleep(0.02)
        node.proc.kill()  # kill -9 once the process runs, before pycri recorded it
        with pytest.raises(grpc.RpcError):
            pending.result(timeout=30)
    node.proc.socket.unlink()
    node.start()
    st = node.status(cid)
    assert st.state == pb.CONTAINER_RUNNING
    assert st.started_at > 0
    assert node.exec(cid, "echo", "alive").stdout == b"alive\n"


def test_a_kill_mid_layer_leaves_no_partial_layer(node: Node, registry: Registry,
                                                  tmp_path: Path) -> None:
    """Issue 40: a layer is downloaded and extracted at once. A kill -9 while both are
    half-way leaves its extraction in the image temp dir, which the restart empties;
    no layer, blob or image appears, and the next pull of it succeeds."""
    entries = [images.directory("d")] + [images.file(f"d/f{i:04}", os.urandom(4096))
                                         for i in range(2000)]
    ref = images.push_image(registry.addr, tmp_path / "layout", f"crash-{secrets.token_hex(4)}",
                            "v1", [images.ImageSpec(layers=[entries])])
    root = node.tmp / "root"
    layers_before = set(os.listdir(root / "layers"))
    blobs_before = set(os.listdir(root / "content" / "blobs" / "sha256"))
    front = HoldFront(registry.addr, over=100_000)
    front.start()
    held = ref.replace(registry.addr, front.addr)
    try:
        with ThreadPoolExecutor(1) as pool:
            pulling = pool.submit(node.cri.image.PullImage,
                                  pb.PullImageRequest(image=pb.ImageSpec(image=held)))
            assert front.holding.wait(30), "the layer was never asked for"
            deadline = time.monotonic() + 15
            while not any((d / "d").is_dir() and len(os.listdir(d / "d")) > 100
                          for d in (root / "tmp").iterdir()):
                assert time.monotonic() < deadline, "no extraction while the download is held"
                time.sleep(0.05)
            node.restart(signal.SIGKILL)
            with pytest.raises(grpc.RpcError):
                pulling.result(30)
        assert list((root / "tmp").iterdir()) == []
        assert set(os.listdir(root / "layers")) == layers_before
        assert set(os.listdir(root / "content" / "blobs" / "sha256")) == blobs_before
        status = node.cri.image.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=held)))
        assert not status.HasField("image")
        front.release.set()
        node.cri.image.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=held)))
        status = node.cri.image.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=held)))
        assert status.HasField("image") and status.image.size > 2000 * 4096
    finally:
        front.release.set()
        front.stop()
