"""The CNI manager the pod-sandbox code calls: status, setup (ADD) and teardown (DEL).

Every pod gets two networks, as under containerd: a built-in one-plugin
`loopback` network on `lo` (the kubelet expects the runtime to bring `lo`
up) and the selected network on the pod's interface. The conf dir is
re-checked on every `status()`/`setup()` call (a stat per file, no polling).

Callers must serialise calls per sandbox and run `teardown` before removing
the pod's netns: with the netns gone the bridge plugin still releases the IP
lease but cannot find the pod's addresses, so it skips its ipMasq cleanup
(Debian containernetworking-plugins 1.1.1, bridge cmdDel). After a reboot
that is harmless: the iptables rules are gone too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pycri.config import CNIConfig
from pycri.errors import FailedPrecondition, InvalidArgument
from pycri.network import conf
from pycri.network.cache import CorruptEntry, ResultCache, check_id
from pycri.network.conf import LOOPBACK_NETWORK, NetworkConfig
from pycri.network.plugin import CNIPluginError, Invocation, find_plugin, run_plugin
from pycri.together import all_or_none, all_settled

log = logging.getLogger(__name__)

NOT_READY_REASON = "NetworkPluginNotReady"
_PROTOCOLS = ("tcp", "udp", "sctp")
# The bandwidth plugin wants a burst with every rate; like containerd, pass a huge
# one (math.MaxInt32 bits) so only the rate limits.
_BURST_BITS = 2**31 - 1


@dataclass(frozen=True)
class PortMapping:
    protocol: str  # tcp | udp | sctp (any case)
    container_port: int
    host_port: int
    host_ip: str = ""


@dataclass(frozen=True)
class Bandwidth:
    """Rates in bits per second; None means unlimited."""

    ingress: int | None = None
    egress: int | None = None


@dataclass(frozen=True)
class DNS:
    servers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodNetwork:
    """What CNI needs to know about one pod sandbox."""

    sandbox_id: str
    netns: str
    name: str
    namespace: str
    uid: str
    ifname: str = "eth0"
    port_mappings: tuple[PortMapping, ...] = ()
    bandwidth: Bandwidth | None = None
    dns: DNS | None = None
    cgroup_path: str = ""
    ips: tuple[str, ...] = ()  # static IPs requested through the `ips` capability


@dataclass(frozen=True)
class NetworkResult:
    """The pod's addresses (IPv4 first, then IPv6, result order within a family)."""

    ips: tuple[str, ...]
    raw: dict[str, Any] = field(repr=False)

    @property
    def primary_ip(self) -> str:
        return self.ips[0] if self.ips else ""

    @classmethod
    def from_cni(cls, raw: dict[str, Any]) -> NetworkResult:
        found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
        if isinstance(raw.get("ips"), list):  # CNI >= 0.3.0
            ifaces = raw.get("interfaces") or []
            for entry in raw["ips"]:
                idx = entry.get("interface")
                # Only addresses on the pod side (interfaces with a sandbox) count.
                if (
                    isinstance(idx, int)
                    and 0 <= idx < len(ifaces)
                    and not ifaces[idx].get("sandbox")
                ):
                    continue
                found.append(ipaddress.ip_interface(entry["address"]).ip)
        else:  # CNI 0.1.0 / 0.2.0
            for key in ("ip4", "ip6"):
                if isinstance(raw.get(key), dict) and raw[key].get("ip"):
                    found.append(ipaddress.ip_interface(raw[key]["ip"]).ip)
        ordered = [a for a in found if a.version == 4] + [a for a in found if a.version == 6]
        return cls(ips=tuple(str(a) for a in ordered), raw=raw)


class NetworkStatus(NamedTuple):
    ready: bool
    reason: str
    message: str


def _check_pod(pod: PodNetwork) -> None:
    check_id(pod.sandbox_id)
    if not os.path.isabs(pod.netns):
        raise InvalidArgument(f"netns path must be absolute, got {pod.netns!r}")
    if not pod.ifname or len(pod.ifname) > 15 or "/" in pod.ifname:
        raise InvalidArgument(f"invalid interface name {pod.ifname!r}")
    for key, value in (("name", pod.name), ("namespace", pod.namespace), ("uid", pod.uid)):
        if ";" in value or "=" in value or "\0" in value:
            raise InvalidArgument(f"pod {key} {value!r} may not contain ';', '=' or NUL")
    for pm in pod.port_mappings:
        if pm.protocol.lower() not in _PROTOCOLS:
            raise InvalidArgument(f"port mapping protocol {pm.protocol!r} is not tcp/udp/sctp")
        if not 0 < pm.container_port < 65536 or not 0 <= pm.host_port < 65536:
            raise InvalidArgument(f"port mapping {pm} has a port out of range")
        if pm.host_ip:
            try:
                ipaddress.ip_address(pm.host_ip)
            except ValueError:
                raise InvalidArgument(f"port mapping host IP {pm.host_ip!r} is invalid") from None
    for ip in pod.ips:
        try:
            ipaddress.ip_interface(ip)
        except ValueError:
            raise InvalidArgument(f"requested pod IP {ip!r} is invalid") from None


def cni_args(pod: PodNetwork) -> str:
    return ";".join(
        [
            "IgnoreUnknown=1",
            f"K8S_POD_NAMESPACE={pod.namespace}",
            f"K8S_POD_NAME={pod.name}",
            f"K8S_POD_INFRA_CONTAINER_ID={pod.sandbox_id}",
            f"K8S_POD_UID={pod.uid}",
        ]
    )


def runtime_config(pod: PodNetwork) -> dict[str, Any]:
    """Every capability argument the pod has; each plugin gets the ones it declares."""
    rc: dict[str, Any] = {}
    maps = []
    for pm in pod.port_mappings:
        if pm.host_port == 0:  # not exposed on the host: nothing for portmap to do
            continue
        m: dict[str, Any] = {
            "hostPort": pm.host_port,
            "containerPort": pm.container_port,
            "protocol": pm.protocol.lower(),
        }
        if pm.host_ip:
            m["hostIP"] = pm.host_ip
        maps.append(m)
    if maps:
        rc["portMappings"] = maps
    bw = pod.bandwidth
    if bw and (bw.ingress or bw.egress):
        b: dict[str, int] = {}
        if bw.ingress:
            b.update(ingressRate=bw.ingress, ingressBurst=_BURST_BITS)
        if bw.egress:
            b.update(egressRate=bw.egress, egressBurst=_BURST_BITS)
        rc["bandwidth"] = b
    if pod.dns and (pod.dns.servers or pod.dns.searches or pod.dns.options):
        rc["dns"] = {
            "servers": list(pod.dns.servers),
            "searches": list(pod.dns.searches),
            "options": list(pod.dns.options),
        }
    if pod.ips:
        rc["ips"] = list(pod.ips)
    if pod.cgroup_path:
        rc["cgroupPath"] = pod.cgroup_path
    return rc


def plugin_stdin(
    net: NetworkConfig,
    plugin: dict[str, Any],
    runtime: dict[str, Any],
    prev_result: dict[str, Any] | None,
) -> dict[str, Any]:
    """The config one plugin reads: its own entry plus the list's name/version,
    the previous result, and only the runtimeConfig keys it declared as capabilities."""
    stdin = dict(plugin)
    stdin["name"] = net.name
    stdin["cniVersion"] = net.cni_version
    caps = plugin.get("capabilities") or {}
    granted = {k: v for k, v in runtime.items() if caps.get(k)}
    if granted:
        base = plugin.get("runtimeConfig")
        stdin["runtimeConfig"] = {**(base if isinstance(base, dict) else {}), **granted}
    if prev_result is not None:
        stdin["prevResult"] = prev_result
    return stdin


class CNIManager:
    """Loads the pod network config and runs the CNI plugins for pod setup/teardown."""

    def __init__(
        self,
        conf_dir: Path,
        bin_dirs: list[str],
        cache_dir: Path,
        *,
        default_network: bool = True,
        default_subnet: str = "10.85.0.0/16",
        default_bridge: str = "pycri0",
        default_template: Path = conf.DEFAULT_TEMPLATE,
        default_ipam_data_dir: str | None = None,
        plugin_timeout: float = 60.0,
    ) -> None:
        self.conf_dir = conf_dir
        self.bin_dirs = list(bin_dirs)
        self.cache = ResultCache(cache_dir)
        self.plugin_timeout = plugin_timeout
        self._use_default = default_network
        self._default_args = (default_template, default_subnet, default_bridge,
                              default_ipam_data_dir)
        self._signature: tuple[Any, ...] | None = None
        self._network: NetworkConfig | None = None
        self._load_error = ""

    @classmethod
    def from_config(cls, cfg: CNIConfig, cache_dir: Path) -> CNIManager:
        return cls(
            Path(cfg.conf_dir),
            cfg.bin_dirs,
            cache_dir,
            default_network=cfg.default_network,
            default_subnet=cfg.default_subnet,
            default_bridge=cfg.default_bridge,
            plugin_timeout=cfg.plugin_timeout,
        )

    # -- configuration -------------------------------------------------------------

    def reconfigure(self, cfg: CNIConfig) -> None:
        """Take new conf/bin dirs and plugin timeout (reload); the network is re-read
        before the next pod. Existing pods tear down with the config cached at their ADD."""
        self.conf_dir = Path(cfg.conf_dir)
        self.bin_dirs = list(cfg.bin_dirs)
        self.plugin_timeout = cfg.plugin_timeout
        self._signature = None

    def network(self) -> NetworkConfig | None:
        """The network new pods join; re-read when the conf dir changed."""
        sig = conf.dir_signature(self.conf_dir)
        if sig == self._signature:
            return self._network
        self._signature = sig
        old = self._network
        net = conf.find_network(self.conf_dir)
        self._load_error = "" if net else f"no valid CNI network config in {self.conf_dir}"
        if net is None and self._use_default:
            template, subnet, bridge, data_dir = self._default_args
            try:
                net = conf.default_network(template, subnet, bridge, data_dir)
            except (OSError, ValueError) as e:
                self._load_error += f"; default network unusable: {e}"
                log.error("cannot load default CNI network from %s: %s", template, e)
            else:
                if old is None or old.source != net.source:
                    log.info("no CNI config in %s: using the default network %r "
                             "(bridge %s, subnet %s)", self.conf_dir, net.name, bridge, subnet)
        if net and net.source != "<default>" and old != net:
            log.info("CNI network %r loaded from %s", net.name, net.source)
        self._network = net
        return net

    def _missing_plugins(self, net: NetworkConfig) -> list[str]:
        types = [p["type"] for p in (*LOOPBACK_NETWORK.plugins, *net.plugins)]
        return [t for t in types if find_plugin(t, self.bin_dirs) is None]

    def status(self) -> NetworkStatus:
        net = self.network()
        if net is None:
            return NetworkStatus(False, NOT_READY_REASON,
                                 f"Network plugin returns error: {self._load_error}")
        missing = self._missing_plugins(net)
        if missing:
            return NetworkStatus(
                False,
                NOT_READY_REASON,
                f"Network plugin returns error: CNI plugin(s) {', '.join(missing)} of network "
                f"{net.name!r} not found in {', '.join(self.bin_dirs)}",
            )
        return NetworkStatus(True, "", "")

    # -- ADD / DEL -----------------------------------------------------------------

    def _binary(self, plugin_type: str) -> str:
        path = find_plugin(plugin_type, self.bin_dirs)
        if path is None:
            raise CNIPluginError(plugin_type, "exec",
                                 f"binary not found in {', '.join(self.bin_dirs)}")
        return path

    async def _del_plugins(
        self,
        net: NetworkConfig,
        plugins: tuple[dict[str, Any], ...],
        call: Invocation,
        runtime: dict[str, Any],
        prev_result: dict[str, Any] | None,
    ) -> None:
        """DEL `plugins` in reverse order, every one of them even past a failure (so a
        broken plugin cannot strand the IP lease of the ones before it); the first
        failure is raised afterwards and the caller keeps the cache for a retry."""
        prev = prev_result if net.del_gets_prev_result else None
        first_error: Exception | None = None
        for plugin in reversed(plugins):
            stdin = plugin_stdin(net, plugin, runtime, prev)
            try:
                await run_plugin(self._binary(plugin["type"]), plugin["type"], call, stdin,
                                 self.plugin_timeout)
            except Exception as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error

    async def _add_network(
        self, net: NetworkConfig, seq: int, pod: PodNetwork, ifname: str
    ) -> dict[str, Any]:
        """ADD one network; on failure DEL what ran (reverse), then raise."""
        runtime = runtime_config(pod)
        args = cni_args(pod)
        entry: dict[str, Any] = {
            "seq": seq,
            "containerId": pod.sandbox_id,
            "ifName": ifname,
            "netns": pod.netns,
            "cniArgs": args,
            "runtimeConfig": runtime,
            "config": net.to_json(),
            "result": None,  # set once ADD completed; None = ADD in progress or crashed
        }
        # Written first, so a crash mid-ADD still leaves what DEL needs.
        await self.cache.write(pod.sandbox_id, net.name, entry)
        bins = tuple(self.bin_dirs)
        add = Invocation("ADD", pod.sandbox_id, pod.netns, ifname, args, bins)
        result: dict[str, Any] | None = None
        ran: list[dict[str, Any]] = []
        try:
            for plugin in net.plugins:
                stdin = plugin_stdin(net, plugin, runtime, result)
                ran.append(plugin)
                result = await run_plugin(self._binary(plugin["type"]), plugin["type"], add,
                                          stdin, self.plugin_timeout)
        except BaseException as e:
            delete = Invocation("DEL", pod.sandbox_id, pod.netns, ifname, args, bins)
            try:
                # The failed plugin is included: it may have half-done its work.
                await self._del_plugins(net, tuple(ran), delete, runtime, result)
            except Exception as undo:
                log.error("sandbox %s: undoing failed CNI ADD of %r also failed (%s); "
                          "kept cache entry for a later teardown", pod.sandbox_id, net.name, undo)
            else:
                await self.cache.remove(pod.sandbox_id, net.name)
            if isinstance(e, CNIPluginError):
                e.add_note(f"network {net.name!r}, sandbox {pod.sandbox_id}")
            raise
        assert result is not None  # a network has at least one plugin
        entry["result"] = result
        await self.cache.write(pod.sandbox_id, net.name, entry)
        return result

    async def setup(self, pod: PodNetwork) -> NetworkResult:
        """Attach the pod's netns to loopback and the pod network; all or nothing."""
        _check_pod(pod)
        st = self.status()
        if not st.ready:
            raise FailedPrecondition(st.message)
        net = self.network()
        assert net is not None
        if net.name == LOOPBACK_NETWORK.name:
            raise FailedPrecondition(f"CNI network name {net.name!r} is reserved by pycri")
        if self.cache.read_all(pod.sandbox_id):
            raise FailedPrecondition(
                f"sandbox {pod.sandbox_id} already has CNI state; tear it down first")
        results: list[dict[str, Any]] = []

        async def add_pod_network() -> None:
            results.append(await self._add_network(net, 1, pod, pod.ifname))

        try:
            # `lo` and the pod's interface are independent: both networks at once.
            await all_or_none(self._add_network(LOOPBACK_NETWORK, 0, pod, "lo"),
                              add_pod_network())
            try:
                res = NetworkResult.from_cni(results[0])
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise CNIPluginError(net.plugins[-1]["type"], "ADD",
                                     f"unreadable result: {e!r}") from None
        except BaseException:
            await self._teardown_entries(pod, raise_errors=False)
            raise
        log.info("sandbox %s joined CNI network %r with IPs %s", pod.sandbox_id, net.name,
                 ", ".join(res.ips) or "none")
        return res

    def _del_call(self, pod: PodNetwork, entry: dict[str, Any]) -> tuple[NetworkConfig, Invocation]:
        """The network and DEL invocation a cache entry describes; CorruptEntry if it
        cannot describe one (a hand-edited or truncated file, a value no plugin can get)."""
        try:
            net = conf.from_json(entry["config"], "<cache>")
            env = (pod.netns or entry["netns"], entry["ifName"], entry["cniArgs"])
            if not all(isinstance(v, str) and "\0" not in v for v in env):
                raise ValueError("netns, ifName and cniArgs must be strings without NUL")
            if not isinstance(entry["runtimeConfig"], dict):
                raise ValueError("runtimeConfig is not an object")
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptEntry(f"CNI cache entry of sandbox {pod.sandbox_id} is unusable: "
                               f"{type(e).__name__}: {e}") from None
        return net, Invocation("DEL", pod.sandbox_id, *env, tuple(self.bin_dirs))

    async def _teardown_entries(self, pod: PodNetwork, raise_errors: bool) -> None:
        entries = self.cache.read_all(pod.sandbox_id)
        if not all(isinstance(e.get("seq"), int) for e in entries):
            raise CorruptEntry(f"CNI cache of sandbox {pod.sandbox_id} has an entry without seq")
        calls = [self._del_call(pod, entry) for entry in entries]

        async def delete(net: NetworkConfig, call: Invocation, entry: dict[str, Any]) -> None:
            try:
                await self._del_plugins(net, net.plugins, call, entry["runtimeConfig"],
                                        entry.get("result"))
            except Exception as e:
                log.error("sandbox %s: CNI DEL of network %r failed: %s",
                          pod.sandbox_id, net.name, e)
                raise
            await self.cache.remove(pod.sandbox_id, net.name)

        # The networks are independent (`lo`, the pod's interface): all DELs at once,
        # each to its end even if another fails.
        try:
            await all_settled(*(delete(net, call, entry)
                                for (net, call), entry in zip(calls, entries, strict=True)))
        except Exception:
            if raise_errors:
                raise
            return
        await self.cache.prune(pod.sandbox_id)  # a crash mid-write leaves only a .tmp

    async def teardown(self, pod: PodNetwork) -> None:
        """DEL every network the pod joined, with the config and result cached at ADD.

        A pod with nothing cached (never set up, or already torn down) is success.
        On a plugin failure the cache entry stays, so the call can be retried.
        """
        check_id(pod.sandbox_id)
        await self._teardown_entries(pod, raise_errors=True)

    def cached_ips(self, sandbox_id: str) -> list[str] | None:
        """The pod's addresses as its cache says (a damaged database's rebuild): None
        when it has no cache (its network was torn down), [] when the cache cannot
        say (an ADD cut short, a damaged entry: the teardown still finds what it can)."""
        try:
            entries = self.cache.read_all(sandbox_id)
        except CorruptEntry:
            return []
        if not entries:
            return None
        for entry in entries:
            if entry.get("seq") == 1 and isinstance(entry.get("result"), dict):
                with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
                    return list(NetworkResult.from_cni(entry["result"]).ips)
        return []

    async def teardown_rebuilt(self, pod: PodNetwork, why: CorruptEntry) -> None:
        """The pod's network, torn down when its cache cannot say how (a truncated or
        hand-edited file): DEL what the pod's record rebuilds (the configured network
        and loopback, the pod's netns, interface, CNI args and capabilities; no
        prevResult), every failure logged and none raised, then the damaged cache set
        aside for a person to read. The pod can always go; what a plugin kept only in
        the lost result (an address it chose) may stay leased, and the log says so."""
        check_id(pod.sandbox_id)
        log.error("sandbox %s: %s; tearing its network down from what is known",
                  pod.sandbox_id, why)
        nets = [(LOOPBACK_NETWORK, "lo")]
        if (net := self.network()) is not None:
            nets.append((net, pod.ifname))
        args, runtime = cni_args(pod), runtime_config(pod)

        async def delete(net: NetworkConfig, ifname: str) -> None:
            call = Invocation("DEL", pod.sandbox_id, pod.netns, ifname, args,
                              tuple(self.bin_dirs))
            try:
                await self._del_plugins(net, net.plugins, call, runtime, None)
            except Exception as e:
                log.error("sandbox %s: rebuilt CNI DEL of network %r failed (%s); what it "
                          "leased may stay leased", pod.sandbox_id, net.name, e)

        await all_settled(*(delete(net, ifname) for net, ifname in nets))
        try:
            where = await self.cache.set_aside(pod.sandbox_id)
        except OSError as e:
            log.error("sandbox %s: its damaged CNI cache could not be set aside: %s",
                      pod.sandbox_id, e.strerror or e)
        else:
            log.error("sandbox %s: its damaged CNI cache was moved to %s",
                      pod.sandbox_id, where)
