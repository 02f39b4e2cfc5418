"""End to end: a real `pycri serve` answering Version, Status, and naming what it lacks."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from pathlib import Path

import grpc
import pytest
from google.protobuf import message_factory

from pycri.api import api_pb2 as pb
from pycri.server.runtime_service import RuntimeServicer
from tests.conftest import CRIClient, PycriProcess

pytestmark = pytest.mark.e2e


def test_version(cri: CRIClient) -> None:
    v = cri.runtime.Version(pb.VersionRequest(version="v1"))
    assert v.runtime_name == "pycri"
    assert v.runtime_api_version == "v1"
    assert v.runtime_version


def test_status_conditions_and_verbose_info(cri: CRIClient) -> None:
    resp = cri.runtime.Status(pb.StatusRequest(verbose=True))
    conds = {c.type: c for c in resp.status.conditions}
    assert conds["RuntimeReady"].status is True
    assert "NetworkReady" in conds
    if not conds["NetworkReady"].status:
        assert conds["NetworkReady"].reason == "NetworkPluginNotReady"
        assert conds["NetworkReady"].message
    info = json.loads(resp.info["info"])
    assert info["config"]["default_runtime"] == "runc"
    assert {h.name for h in resp.runtime_handlers} >= {"", "runc", "crun"}
    assert not cri.runtime.Status(pb.StatusRequest()).info


def test_runtime_config_and_pod_cidr_kept(pycri: PycriProcess) -> None:
    c = pycri.client()
    assert c.runtime.RuntimeConfig(pb.RuntimeConfigRequest()).linux.cgroup_driver == pb.CGROUPFS
    c.runtime.UpdateRuntimeConfig(
        pb.UpdateRuntimeConfigRequest(
            runtime_config=pb.RuntimeConfig(network_config=pb.NetworkConfig(pod_cidr="10.9.0.0/24"))
        )
    )
    c.channel.close()
    assert pycri.stop() == 0
    pycri.start()
    c = pycri.client()
    info = json.loads(c.runtime.Status(pb.StatusRequest(verbose=True)).info["info"])
    assert info["podCIDR"] == "10.9.0.0/24"
    c.channel.close()


def _unbuilt_unary_rpc() -> str | None:
    """A unary RuntimeService RPC pycri still answers UNIMPLEMENTED, if any is left."""
    service = pb.DESCRIPTOR.services_by_name["RuntimeService"]
    for m in service.methods:
        handler = getattr(RuntimeServicer, m.name)
        if "_unimplemented" in handler.__qualname__ and not m.server_streaming:
            return str(m.name)
    return None


UNBUILT = _unbuilt_unary_rpc()


@pytest.mark.skipif(UNBUILT is None, reason="every unary RuntimeService RPC is served")
def test_unbuilt_rpc_names_itself(cri: CRIClient) -> None:
    assert UNBUILT is not None
    method = pb.DESCRIPTOR.services_by_name["RuntimeService"].methods_by_name[UNBUILT]
    request = message_factory.GetMessageClass(method.input_type)()
    with pytest.raises(grpc.RpcError) as e:
        getattr(cri.runtime, UNBUILT)(request)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert UNBUILT in (e.value.details() or "")


def test_garbage_request_gets_an_error_not_a_crash(cri: CRIClient, pycri: PycriProcess) -> None:
    raw = cri.channel.unary_unary("/runtime.v1.RuntimeService/Version")
    with pytest.raises(grpc.RpcError) as e:
        raw(b"\xff\xff\xff\xff\x0f garbage")
    # grpcio itself rejects an undecodable body before pycri sees it.
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    assert "Error parsing message" in (e.value.details() or "")
    truncated = pb.VersionRequest(version="v1" * 50).SerializeToString()[:7]
    with pytest.raises(grpc.RpcError):
        raw(truncated)
    # The server is still there.
    assert cri.runtime.Version(pb.VersionRequest()).runtime_name == "pycri"
    assert pycri.proc is not None and pycri.proc.poll() is None


def test_socket_mode(pycri: PycriProcess) -> None:
    assert stat.S_IMODE(os.stat(pycri.socket).st_mode) == 0o660


def test_second_daemon_on_live_socket_is_refused(pycri: PycriProcess, tmp_path: Path) -> None:
    # Another state dir, same socket: the live socket must not be taken over.
    out = subprocess.run(
        [
            *pycri.argv()[:-6],
            "--root",
            str(tmp_path / "r2"),
            "--state",
            str(tmp_path / "s2"),
            "--socket",
            str(pycri.socket),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1
    assert "served by another process" in out.stderr
    # Same state dir: refused by the lock before the socket is touched.
    out = subprocess.run(pycri.argv(), capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "another pycri is running" in out.stderr
    assert pycri.client().runtime.Version(pb.VersionRequest()).runtime_name == "pycri"


def test_stale_socket_is_replaced(pycri_dirs: PycriProcess) -> None:
    pycri_dirs.state.mkdir(parents=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(pycri_dirs.socket))
    s.close()  # bound, never listening: what a crashed daemon leaves behind
    pycri_dirs.start()
    try:
        assert pycri_dirs.client().runtime.Version(pb.VersionRequest()).runtime_name == "pycri"
    finally:
        assert pycri_dirs.stop() == 0


def test_sigkill_then_restart(pycri_dirs: PycriProcess) -> None:
    pycri_dirs.start()
    pycri_dirs.kill()  # leaves the socket file behind, like a crash
    assert pycri_dirs.socket.exists()
    pycri_dirs.start()
    try:
        assert pycri_dirs.client().runtime.Version(pb.VersionRequest()).runtime_name == "pycri"
    finally:
        assert pycri_dirs.stop() == 0


def test_root_and_metadata_are_private(pycri: PycriProcess) -> None:
    # Layers keep images' setuid bits and device nodes: no other user may reach them.
    assert stat.S_IMODE(os.stat(pycri.root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(pycri.root / "pycri.db").st_mode) == 0o600
