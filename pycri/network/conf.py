"""CNI network configuration: pick the network from the conf dir, or the built-in default.

Selection follows libcni's convention so operators' existing files behave as
under containerd/CRI-O: the lexically first loadable `*.conf`, `*.conflist` or
`*.json` wins; a single-plugin `.conf`/`.json` is wrapped as a one-plugin list.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pycri import conffiles
from pycri.resources import data_path

log = logging.getLogger(__name__)

CONF_EXTENSIONS = (".conf", ".conflist", ".json")
DEFAULT_TEMPLATE = data_path("pycri-default.conflist")

# The CNI spec's rule for network names; also keeps them safe as cache file names.
_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
# Without cniVersion a config is read as the spec's first version.
_IMPLICIT_VERSION = "0.1.0"


@dataclass(frozen=True)
class NetworkConfig:
    """A parsed network list: what plugins to run, in order, and under which name."""

    name: str
    cni_version: str
    plugins: tuple[dict[str, Any], ...]
    source: str  # file it came from, or "<default>" / "<builtin>"

    def to_json(self) -> dict[str, Any]:
        return {
            "cniVersion": self.cni_version,
            "name": self.name,
            "plugins": [copy.deepcopy(p) for p in self.plugins],
        }

    @property
    def del_gets_prev_result(self) -> bool:
        """CNI 0.4.0 added prevResult to DEL; older plugins must not see it."""
        return version_tuple(self.cni_version) >= (0, 4, 0)


def version_tuple(v: str) -> tuple[int, int, int]:
    m = _VERSION_RE.match(v)
    if not m:
        raise ValueError("cniVersion: expected the form X.Y.Z")
    return int(m[1]), int(m[2]), int(m[3])


def _check_plugin(p: Any, where: str) -> dict[str, Any]:
    if not isinstance(p, dict):
        raise ValueError(f"{where}: plugin entry is not an object")
    t = p.get("type")
    if not isinstance(t, str) or not t or "/" in t or t in (".", ".."):
        raise ValueError(f"{where}: plugin 'type' must be a plain binary name")
    caps = p.get("capabilities", {})
    if not isinstance(caps, dict):
        raise ValueError(f"{where}: 'capabilities' must be an object")
    return p


def from_json(data: Any, source: str, single: bool = False) -> NetworkConfig:
    """Validate a decoded conflist (or, with `single`, a one-plugin conf) -> NetworkConfig."""
    if not isinstance(data, dict):
        raise ValueError("top level is not a JSON object")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError("network 'name' missing or invalid")
    version = data.get("cniVersion", _IMPLICIT_VERSION)
    if not isinstance(version, str):
        raise ValueError("'cniVersion' must be a string")
    version_tuple(version)
    if single:
        plugin = {k: v for k, v in data.items() if k not in ("name", "cniVersion")}
        plugins: list[Any] = [plugin]
    else:
        raw = data.get("plugins")
        if not isinstance(raw, list) or not raw:
            raise ValueError("'plugins' must be a non-empty list")
        plugins = raw
    checked = tuple(_check_plugin(p, f"plugin {i}") for i, p in enumerate(plugins))
    return NetworkConfig(name=name, cni_version=version, plugins=checked, source=source)


def load_file(path: Path) -> NetworkConfig:
    """Parse one file; `.conflist` is a list, `.conf`/`.json` a single plugin unless it has
    a `plugins` key (libcni accepts a list under `.json` too)."""
    data = conffiles.load_json(path)  # the one door: OSError, or ValueError saying why
    single = path.suffix != ".conflist" and not (isinstance(data, dict) and "plugins" in data)
    return from_json(data, str(path), single=single)


def candidate_files(conf_dir: Path) -> list[Path]:
    try:
        names = sorted(os.listdir(conf_dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [conf_dir / n for n in names if n.endswith(CONF_EXTENSIONS)]


def find_network(conf_dir: Path) -> NetworkConfig | None:
    """The lexically first loadable network in `conf_dir`; bad files are logged and skipped."""
    for path in candidate_files(conf_dir):
        try:
            return load_file(path)
        except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError
            log.warning("skipping CNI config %s: %s", path, e)
    return None


def dir_signature(conf_dir: Path) -> tuple[Any, ...]:
    """Cheap fingerprint of the conf dir: changes when a file is added, removed or rewritten."""
    try:
        dir_mtime = os.stat(conf_dir).st_mtime_ns
    except OSError:
        return ()
    files: list[tuple[str, int, int]] = []
    for p in candidate_files(conf_dir):
        try:
            st = os.stat(p)
        except OSError:
            continue
        files.append((p.name, st.st_mtime_ns, st.st_size))
    return (dir_mtime, tuple(files))


def _substitute(node: Any, values: dict[str, str]) -> Any:
    if isinstance(node, dict):
        return {k: _substitute(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, values) for v in node]
    if isinstance(node, str) and node in values:
        return values[node]
    return node


def default_network(
    template: Path, subnet: str, bridge: str, ipam_data_dir: str | None = None
) -> NetworkConfig:
    """Render the shipped default conflist (see pycri/data/README.md for its placeholders)."""
    net = ipaddress.ip_network(subnet, strict=False)  # ValueError names the bad subnet
    if not bridge or len(bridge) > 15 or "/" in bridge or " " in bridge:
        raise ValueError(f"invalid bridge name {bridge!r}")
    values = {
        "@SUBNET@": str(net),
        "@BRIDGE@": bridge,
        "@DEFAULT_ROUTE@": "0.0.0.0/0" if net.version == 4 else "::/0",
    }
    data = _substitute(json.loads(template.read_bytes()), values)
    if ipam_data_dir:
        for p in data["plugins"]:
            if isinstance(p.get("ipam"), dict):
                p["ipam"]["dataDir"] = ipam_data_dir
    return from_json(data, "<default>")


LOOPBACK_NETWORK = NetworkConfig(
    name="cni-loopback", cni_version="1.0.0", plugins=({"type": "loopback"},), source="<builtin>"
)
