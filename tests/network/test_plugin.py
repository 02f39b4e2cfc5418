"""A CNI plugin's output is read at one bounded door (procs.run's max_output)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pycri.network import CNIPluginError
from pycri.network.plugin import Invocation, run_plugin

CALL = Invocation("ADD", "c1", "/var/run/netns/none", "eth0", "", ())


def plugin(tmp_path: Path, body: str) -> str:
    path = tmp_path / "plugin"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


async def test_a_plugin_printing_without_end_is_cut_off_at_1_mib(tmp_path: Path) -> None:
    """Issue 41: 512 MiB of stdout was buffered before the 1 MiB limit applied."""
    started = time.monotonic()
    with pytest.raises(CNIPluginError, match="printed more than 1 MiB on stdout, killed"):
        await run_plugin(plugin(tmp_path, "exec yes"), "flood", CALL, {}, timeout=60)
    assert time.monotonic() - started < 30  # the bound, not the plugin timeout, ended it


async def test_a_result_within_the_bound_is_taken(tmp_path: Path) -> None:
    pad = " " * ((1 << 20) - 64)
    body = f"cat > /dev/null; printf '{{\"cniVersion\": \"1.0.0\"}}{pad}'"
    assert await run_plugin(plugin(tmp_path, body), "big", CALL, {}, timeout=60) == {
        "cniVersion": "1.0.0"}
