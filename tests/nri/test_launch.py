"""Pre-installed plugins: discovered in plugin_path, started with an inherited socket."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from pycri.nri import launch
from pycri.nri.api import api_pb2 as api
from pycri.nri.link import PluginLink
from tests.lib.fds import new_fds, open_fds

REPO = Path(__file__).resolve().parents[2]
PLUGIN = f"""#!{sys.executable}
import sys
sys.path.insert(0, {str(REPO)!r})
from tests.lib.nri_plugin import main
sys.exit(main())
"""


class Runtime:
    def __init__(self, config: str) -> None:
        self.config = config
        self.registered = asyncio.Event()

    async def register_plugin(self, link: PluginLink, req: api.RegisterPluginRequest) -> None:
        await link.call("Configure", api.ConfigureRequest(config=self.config),
                        api.ConfigureResponse, 5)
        self.registered.set()

    async def update_containers(self, link: PluginLink, req: api.UpdateContainersRequest
                                ) -> api.UpdateContainersResponse:
        return api.UpdateContainersResponse()


def _exe(path: Path, text: str, mode: int = 0o755) -> None:
    path.write_text(text)
    path.chmod(mode)


def test_discover_orders_by_index_then_name_and_finds_configs(tmp_path: Path) -> None:
    plugins, confs = tmp_path / "plugins", tmp_path / "conf.d"
    plugins.mkdir()
    confs.mkdir()
    for name in ("20-b", "10-z", "20-a", "bad", "1-short", "30-no spaces"):
        _exe(plugins / name, "#!/bin/sh\n")
    _exe(plugins / "05-notexec", "#!/bin/sh\n", 0o644)
    (plugins / "07-dir").mkdir()
    (confs / "10-z.conf").write_text("by full name")
    (confs / "z.conf").write_text("by base name (shadowed)")
    (confs / "a.conf").write_text("by base name")
    found = launch.discover(plugins, confs)
    assert [(p.index, p.name, p.config) for p in found] == [
        ("10", "z", "by full name"), ("20", "a", "by base name"), ("20", "b", "")]
    assert launch.discover(tmp_path / "missing", confs) == []
    with pytest.raises(ValueError, match="2-digit index"):
        launch.parse_name("1-short")


def test_a_config_that_is_not_a_file_skips_only_its_plugin(tmp_path: Path) -> None:
    """Issue 41: plugin configs are read at the conffiles door. A FIFO used to block
    discovery (and the daemon's start) until someone wrote to it; a link to /dev/zero
    grew without bound. Each now skips its plugin with a warning naming the file."""
    plugins, confs = tmp_path / "plugins", tmp_path / "conf.d"
    plugins.mkdir()
    confs.mkdir()
    for name in ("10-fifo", "20-zero", "30-dir", "40-good"):
        _exe(plugins / name, "#!/bin/sh\n")
    os.mkfifo(confs / "fifo.conf")
    (confs / "zero.conf").symlink_to("/dev/zero")
    (confs / "dir.conf").mkdir()
    (confs / "good.conf").write_text("ok")
    found = launch.discover(plugins, confs)
    assert [(p.name, p.config) for p in found] == [("good", "ok")]


async def test_preinstalled_plugin_runs_over_its_inherited_socket(tmp_path: Path) -> None:
    plugins, confs = tmp_path / "plugins", tmp_path / "conf.d"
    plugins.mkdir()
    confs.mkdir()
    events = tmp_path / "events.jsonl"
    _exe(plugins / "42-pyplug", PLUGIN)
    config = f"log={events}\n"
    (confs / "pyplug.conf").write_text(config)
    fds = open_fds()
    [started] = await launch.launch_all(plugins, confs)
    assert new_fds(fds) == {str(started.sock.fileno())}  # the child's end is not kept
    assert started.plugin.config == config
    rt = Runtime(started.plugin.config)
    link = PluginLink(started.sock, rt)
    try:
        await link.start()
        await asyncio.wait_for(rt.registered.wait(), 20)
        assert (link.index, link.name) == ("42", "pyplug")
        await link.call("RunPodSandbox", api.RunPodSandboxRequest(pod=api.PodSandbox(id="p1")),
                        api.RunPodSandboxResponse, 5)
    finally:
        await link.close()
    assert await launch.stop(started, grace=10) == 0  # it left when its connection closed
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert [x["method"] for x in lines] == ["Configure", "RunPodSandbox"]
    assert lines[0]["request"]["config"] == config
    assert lines[1]["request"]["pod"]["id"] == "p1"
    env = lines[0]["env"]
    assert (env["NRI_PLUGIN_NAME"], env["NRI_PLUGIN_IDX"]) == ("pyplug", "42")
    assert env["NRI_PLUGIN_SOCKET"].isdigit()
    assert lines[0]["pid"] == started.process.pid
    assert new_fds(fds) == set()


async def test_a_plugin_that_will_not_exit_is_killed_and_one_that_cannot_start_skipped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    _exe(plugins / "10-stubborn", "#!/bin/sh\ntrap '' TERM\nsleep 3600 &\nwait\n")
    _exe(plugins / "20-broken", "#!/nonexistent/interpreter\n")
    [started] = await launch.launch_all(plugins, tmp_path / "no-conf")
    assert "cannot start pre-installed plugin" in caplog.text and "20-broken" in caplog.text
    assert started.plugin.name == "stubborn"
    assert await launch.stop(started, grace=0.3) == -9
    assert not os.path.exists(f"/proc/{started.process.pid}")
