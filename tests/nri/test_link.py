"""PluginLink (runtime side) against the test plugin, over real unix sockets."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from pycri import metrics
from pycri.nri.api import api_pb2 as api
from pycri.nri.link import (
    PLUGIN_SERVICE,
    RUNTIME_SERVICE,
    NRIPluginError,
    PluginLink,
    service_handler,
)
from pycri.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Wire
from pycri.nri.ttrpc import TTRPCError
from tests.lib.nri_plugin import ALL_EVENTS, NRIPlugin, PluginThread, event_mask


class Runtime:
    """A RuntimeSide that configures each plugin as it registers (like the adaptation)."""

    def __init__(self) -> None:
        self.registered: list[tuple[str, str]] = []
        self.updates: list[api.UpdateContainersRequest] = []
        self.events: dict[str, int] = {}
        self.fail_register: str | None = None

    async def register_plugin(self, link: PluginLink, req: api.RegisterPluginRequest) -> None:
        if self.fail_register:
            raise TTRPCError(grpc.StatusCode.PERMISSION_DENIED, self.fail_register)
        self.registered.append((link.index, link.name))
        rpl = await link.call("Configure", api.ConfigureRequest(
            config="cfg", runtime_name="pycri", runtime_version="test",
            registration_timeout=5000, request_timeout=2000), api.ConfigureResponse, 5)
        self.events[link.name] = rpl.events

    async def update_containers(self, link: PluginLink, req: api.UpdateContainersRequest
                                ) -> api.UpdateContainersResponse:
        self.updates.append(req)
        return api.UpdateContainersResponse(failed=req.update[1:])


Linked = Callable[[Runtime, NRIPlugin], Awaitable[PluginLink]]


@pytest.fixture
async def linked() -> AsyncIterator[Linked]:
    links: list[PluginLink] = []
    plugins: list[NRIPlugin] = []

    async def make(runtime: Runtime, plugin: NRIPlugin) -> PluginLink:
        a, b = socket.socketpair()
        a.setblocking(False)
        link = PluginLink(a, runtime)
        links.append(link)
        plugins.append(plugin)
        await link.start()
        await plugin.connect(b, timeout=5)
        return link
    yield make
    for p in plugins:
        await p.close()
    for link in links:
        await link.close()


async def test_register_configure_and_events_in_order(linked: Linked) -> None:
    rt = Runtime()
    plugin = NRIPlugin("logger", "10")
    link: PluginLink = await linked(rt, plugin)
    assert (link.index, link.name) == ("10", "logger") and rt.registered == [("10", "logger")]
    assert rt.events["logger"] == event_mask(ALL_EVENTS)
    assert plugin.config is not None and plugin.config.config == "cfg"
    pod = api.PodSandbox(id="p1", name="pod", namespace="ns", uid="u1")
    ctr = api.Container(id="c1", pod_sandbox_id="p1", name="ctr")
    sync = await link.call("Synchronize", api.SynchronizeRequest(pods=[pod], more=True),
                           api.SynchronizeResponse, 5)
    assert sync.more
    await link.call("Synchronize", api.SynchronizeRequest(containers=[ctr]),
                    api.SynchronizeResponse, 5)
    assert plugin.synced is not None
    assert [p.id for p in plugin.synced.pods] == ["p1"]
    assert [c.id for c in plugin.synced.containers] == ["c1"]
    await link.call("RunPodSandbox", api.RunPodSandboxRequest(pod=pod),
                    api.RunPodSandboxResponse, 5)
    plugin.replies["CreateContainer"] = lambda req: api.CreateContainerResponse(
        adjust=api.ContainerAdjustment(annotations={"seen": req.container.name}))
    out = await link.call("CreateContainer", api.CreateContainerRequest(pod=pod, container=ctr),
                          api.CreateContainerResponse, 5)
    assert out.adjust.annotations == {"seen": "ctr"}
    await link.call("StartContainer", api.StartContainerRequest(pod=pod, container=ctr),
                    api.StartContainerResponse, 5)
    assert plugin.names() == ["Configure", "Synchronize", "Synchronize", "RunPodSandbox",
                              "CreateContainer", "StartContainer"]
    got = await plugin.wait_for("RunPodSandbox")
    assert (got.pod.name, got.pod.namespace, got.pod.uid) == ("pod", "ns", "u1")


async def test_plugin_errors_and_timeouts(linked: Linked) -> None:
    plugin = NRIPlugin("bad", "20")
    link: PluginLink = await linked(Runtime(), plugin)

    def errors(method: str) -> float:
        labels = {"plugin": link.name, "method": method}
        return metrics.REGISTRY.get_sample_value("pycri_nri_plugin_errors_total",
                                                 labels) or 0.0  # fmt: skip

    def calls(method: str) -> float:
        labels = {"plugin": link.name, "method": method}
        return metrics.REGISTRY.get_sample_value("pycri_nri_plugin_duration_seconds_count",
                                                 labels) or 0.0  # fmt: skip

    before = {m: (calls(m), errors(m)) for m in ("CreateContainer", "StopContainer")}
    plugin.errors["CreateContainer"] = "refused by policy"
    with pytest.raises(NRIPluginError) as e:
        await link.call("CreateContainer", api.CreateContainerRequest(),
                        api.CreateContainerResponse, 5)
    assert e.value.plugin == "bad" and e.value.code == grpc.StatusCode.UNKNOWN
    assert "refused by policy" in str(e.value) and not e.value.timed_out
    plugin.delays["StopContainer"] = 1.0
    with pytest.raises(NRIPluginError) as e:
        await link.call("StopContainer", api.StopContainerRequest(), api.StopContainerResponse,
                        0.1)
    assert e.value.timed_out
    with pytest.raises(NRIPluginError) as e:
        await link.call("NoSuchMethod", api.Empty(), api.Empty, 5)
    assert e.value.code == grpc.StatusCode.UNIMPLEMENTED
    assert not link.closed.is_set()  # errors and timeouts are the adaptation's to judge
    # Each call is timed and, failed or timed out, counted (pycri_nri_plugin_*).
    for m, (n, failed) in before.items():
        assert (calls(m), errors(m)) == (n + 1, failed + 1), m


async def test_unsolicited_update_containers(linked: Linked) -> None:
    rt = Runtime()
    plugin = NRIPlugin("upd", "30")
    await linked(rt, plugin)
    ups = [api.ContainerUpdate(container_id="c1"), api.ContainerUpdate(container_id="c2")]
    failed = await plugin.update_containers(ups)
    assert [u.container_id for u in failed] == ["c2"]
    assert [u.container_id for u in rt.updates[0].update] == ["c1", "c2"]


async def test_registration_refused_reaches_the_plugin() -> None:
    rt = Runtime()
    rt.fail_register = "no plugins today"
    a, b = socket.socketpair()
    link = PluginLink(a, rt)
    await link.start()
    plugin = NRIPlugin("x", "40")
    try:
        with pytest.raises(TTRPCError) as e:
            await plugin.connect(b, timeout=5)
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert e.value.message == "no plugins today"
    finally:
        await plugin.close()
        await link.close()


async def test_update_before_register_and_register_twice_are_refused() -> None:
    a, b = socket.socketpair()
    link = PluginLink(a, Runtime())
    await link.start()

    async def serve(method: str, request: Message) -> Message:
        return api.ConfigureResponse(events=1)
    plugin = Wire(b, call_conn=RUNTIME_SERVICE_CONN, serve_conn=PLUGIN_SERVICE_CONN,
                  handler=service_handler(PLUGIN_SERVICE, serve))
    await plugin.start()
    register = api.RegisterPluginRequest(plugin_name="y", plugin_idx="41").SerializeToString()
    try:
        with pytest.raises(TTRPCError) as e:
            await plugin.call(RUNTIME_SERVICE, "UpdateContainers", b"", 5)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        await plugin.call(RUNTIME_SERVICE, "RegisterPlugin", register, 5)
        with pytest.raises(TTRPCError) as e:
            await plugin.call(RUNTIME_SERVICE, "RegisterPlugin", register, 5)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "41-y is already registered" in e.value.message
        with pytest.raises(TTRPCError) as e:
            await plugin.call("nri.pkg.api.v1alpha1.Other", "RegisterPlugin", register, 5)
        assert e.value.code == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await plugin.close()
        await link.close()


async def test_peer_gone_sets_closed_and_fails_calls(linked: Linked) -> None:
    plugin = NRIPlugin("gone", "50")
    link: PluginLink = await linked(Runtime(), plugin)
    plugin.delays["StopPodSandbox"] = 30
    call = asyncio.ensure_future(link.call("StopPodSandbox", api.StopPodSandboxRequest(),
                                           api.StopPodSandboxResponse, 60))
    await plugin.wait_for("StopPodSandbox")
    await plugin.close()
    await asyncio.wait_for(link.closed.wait(), 5)
    with pytest.raises(NRIPluginError) as e:
        await call
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert link.reason == "peer closed the connection"


async def test_plugin_thread_over_a_listening_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    rt = Runtime()
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen()
    lsock.setblocking(False)
    pt = PluginThread("thread", "60")
    link: PluginLink | None = None
    try:
        connecting = asyncio.ensure_future(asyncio.to_thread(pt.connect, path, 5))
        conn, _ = await asyncio.get_running_loop().sock_accept(lsock)
        link = PluginLink(conn, rt)
        await link.start()
        await connecting
        assert rt.registered == [("60", "thread")]
        await link.call("RemoveContainer", api.RemoveContainerRequest(
            container=api.Container(id="c9")), api.RemoveContainerResponse, 5)
        got = await asyncio.to_thread(pt.wait_for, "RemoveContainer")
        assert got.container.id == "c9"
        assert await asyncio.to_thread(pt.names) == ["Configure", "RemoveContainer"]
    finally:
        await asyncio.to_thread(pt.close)
        if link is not None:
            await link.close()
        lsock.close()
