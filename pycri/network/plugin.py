"""Running one CNI plugin binary per the CNI spec (environment in, JSON on stdin/stdout)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from pycri import metrics, procs
from pycri.errors import Unavailable

# Plugin output is a small JSON document; anything bigger is a broken plugin.
_MAX_OUTPUT = 1 << 20


class CNIPluginError(Unavailable):
    """A CNI plugin failed; carries the plugin's own error code and message."""

    def __init__(
        self, plugin: str, command: str, msg: str, code: int = 0, details: str = ""
    ) -> None:
        self.plugin = plugin
        self.command = command
        self.code = code
        self.msg = msg
        self.details = details
        text = f"CNI plugin {plugin!r} {command} failed: {msg}"
        if code:
            text += f" (code {code})"
        if details:
            text += f": {details}"
        super().__init__(text)


def find_plugin(plugin_type: str, bin_dirs: list[str]) -> str | None:
    """Path of the first executable `plugin_type` in `bin_dirs`, like libcni's FindInPath."""
    for d in bin_dirs:
        p = os.path.join(d, plugin_type)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


@dataclass(frozen=True)
class Invocation:
    """The CNI_* environment of one call; the same for every plugin of a network."""

    command: str  # ADD | DEL
    container_id: str
    netns: str
    ifname: str
    cni_args: str
    bin_dirs: tuple[str, ...]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            CNI_COMMAND=self.command,
            CNI_CONTAINERID=self.container_id,
            CNI_NETNS=self.netns,
            CNI_IFNAME=self.ifname,
            CNI_ARGS=self.cni_args,
            CNI_PATH=os.pathsep.join(self.bin_dirs),
        )
        return env


def _error_from_output(
    plugin: str, command: str, rc: int, out: bytes, err: bytes
) -> CNIPluginError:
    try:
        doc = json.loads(out)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and ("msg" in doc or "code" in doc):
        code = doc.get("code", 0)
        return CNIPluginError(
            plugin,
            command,
            str(doc.get("msg", "")) or f"exit status {rc}",
            code=code if isinstance(code, int) else 0,
            details=str(doc.get("details", "")),
        )
    tail = (err or out).decode(errors="replace").strip()[-500:]
    return CNIPluginError(plugin, command, f"exit status {rc}" + (f": {tail}" if tail else ""))


async def run_plugin(
    binary: str, plugin: str, call: Invocation, stdin: dict[str, Any], timeout: float
) -> dict[str, Any] | None:
    """Exec `binary`; return its parsed result for ADD, None for DEL. Raises CNIPluginError."""
    failures = metrics.CNI_ERRORS.labels(plugin, call.command)
    try:  # on a timeout or cancellation the plugin and its children are killed
        with metrics.timed(metrics.CNI_SECONDS.labels(plugin, call.command), failures):
            rc, out, err = await procs.run([binary], stdin=json.dumps(stdin).encode(),
                                           timeout=timeout, env=call.env(),
                                           max_output=_MAX_OUTPUT)  # fmt: skip
    except TimeoutError:
        msg = f"no answer within {timeout:g}s, killed (the limit is cni.plugin_timeout)"
        raise CNIPluginError(plugin, call.command, msg) from None
    except procs.OutputTooLarge as e:  # read no further than the bound, then killed
        raise CNIPluginError(plugin, call.command, str(e)) from None
    if rc != 0:
        failures.inc()
        raise _error_from_output(plugin, call.command, rc, out, err)
    if call.command != "ADD":
        return None
    try:
        result = json.loads(out)
    except ValueError:
        result = None
    if not isinstance(result, dict):
        raise CNIPluginError(plugin, call.command, f"result is not a JSON object: {out[:200]!r}")
    return result
