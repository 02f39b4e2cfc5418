"""Helpers for the real CNI tests: a private CNI world per test, host inspection.

Everything is named with a per-session random tag so concurrent test runs and
the rest of the host are never touched.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import secrets
import subprocess
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

from pycri.network import CNIManager, PodNetwork, create_netns

TAG = secrets.token_hex(3)
CNI_BIN = "/usr/lib/cni"
_counter = count(1)
_octet_base = secrets.randbelow(200)


def next_n() -> int:
    return next(_counter)


def subnet_for(n: int) -> str:
    return f"10.199.{(_octet_base + n) % 250}.0/24"


def run(*cmd: str, check: bool = True) -> str:
    return subprocess.run(cmd, check=check, capture_output=True, text=True).stdout


def host_links() -> set[str]:
    return {line.split(":")[1].strip().split("@")[0]
            for line in run("ip", "-o", "link", "show").splitlines()}


def netns_links(ns: str | Path) -> set[str]:
    out = in_netns(ns, "ip", "-o", "link", "show").stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def nat_rules_with(text: str) -> list[str]:
    return [line for line in run("iptables-save", "-t", "nat").splitlines() if text in line]


def in_netns(ns: str | Path, *cmd: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nsenter", f"--net={ns}", *cmd], capture_output=True, text=True,
                          timeout=timeout)


def purge_nat_rules(text: str) -> None:
    """Safety net for a failed test: drop per-pod NAT rules/chains mentioning `text`."""
    chains: set[str] = set()
    for line in nat_rules_with(text):
        if not line.startswith("-A "):
            continue
        # iptables-save quoting is shell quoting, so let sh split it again.
        subprocess.run(["sh", "-c", f"iptables -t nat -D {line[3:]}"], capture_output=True)
        args = line.split()
        if "-j" in args:
            target = args[args.index("-j") + 1]
            if target.startswith("CNI-") and not target.startswith("CNI-HOSTPORT"):
                chains.add(target)
    for chain in chains:
        run("iptables", "-t", "nat", "-F", chain, check=False)
        run("iptables", "-t", "nat", "-X", chain, check=False)


@dataclass
class NetEnv:
    """One test's private CNI world: bridge, subnet, conf/ipam/cache/bin dirs."""

    root: Path
    bridge: str
    subnet: str
    prefix: str  # of netns names and sandbox ids; contains the session tag
    netns: list[Path] = field(default_factory=list)
    pods: list[PodNetwork] = field(default_factory=list)
    managers: list[CNIManager] = field(default_factory=list)

    def __post_init__(self) -> None:
        for d in (self.conf_dir, self.data_dir, self.cache_dir, self.bin_dir):
            d.mkdir()

    conf_dir = property(lambda self: self.root / "net.d")
    data_dir = property(lambda self: self.root / "ipam")
    cache_dir = property(lambda self: self.root / "cache")
    bin_dir = property(lambda self: self.root / "bin")

    @property
    def gateway(self) -> str:
        return str(next(ipaddress.ip_network(self.subnet).hosts()))

    def conflist(self, extra: list[dict[str, Any]] | None = None,
                 name: str = "testnet") -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.data_dir),
                    },
                },
                *(extra or []),
            ],
        }

    def write_conf(self, filename: str, data: dict[str, Any]) -> Path:
        path = self.conf_dir / filename
        path.write_text(json.dumps(data))
        return path

    def manager(self, **kw: Any) -> CNIManager:
        kw.setdefault("default_network", False)
        m = CNIManager(self.conf_dir, [str(self.bin_dir), CNI_BIN], self.cache_dir, **kw)
        self.managers.append(m)
        return m

    async def pod(self, **kw: Any) -> PodNetwork:
        n = next_n()
        ns = await create_netns(f"{self.prefix}-{n}")
        self.netns.append(ns)
        pod = PodNetwork(sandbox_id=f"{self.prefix}-{n}", netns=str(ns), name=f"pod{n}",
                         namespace="default", uid=f"uid-{n}", **kw)
        self.pods.append(pod)
        return pod

    def leases(self) -> list[str]:
        """host-local's lease files are named by IP address."""
        found = []
        for p in self.data_dir.rglob("*"):
            with contextlib.suppress(ValueError):
                found.append(str(ipaddress.ip_address(p.name)))
        return sorted(found)

    def cached(self) -> list[str]:
        return sorted(str(p.relative_to(self.cache_dir)) for p in self.cache_dir.rglob("*.json"))

    def script_plugin(self, name: str, fail_on: str) -> str:
        """A chained plugin that fails `fail_on` (ADD/DEL) with a CNI error JSON while
        the file <bin>/<name>.fail exists, and otherwise passes prevResult through."""
        script = self.bin_dir / name
        script.write_text(
            "#!/usr/bin/python3\n"
            "import json, os, sys\n"
            "conf = json.load(sys.stdin)\n"
            "cmd = os.environ['CNI_COMMAND']\n"
            f"if cmd == {fail_on!r} and os.path.exists(sys.argv[0] + '.fail'):\n"
            "    print(json.dumps({'cniVersion': conf['cniVersion'], 'code': 7,\n"
            "                      'msg': 'injected failure', 'details': 'by the test'}))\n"
            "    sys.exit(1)\n"
            "if cmd == 'ADD':\n"
            "    print(json.dumps(conf['prevResult']))\n"
        )
        script.chmod(0o755)
        (self.bin_dir / f"{name}.fail").touch()
        return name

    def allow(self, plugin: str) -> None:
        (self.bin_dir / f"{plugin}.fail").unlink()
