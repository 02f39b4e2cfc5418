"""pycri's configuration: TOML on disk, defaults that work on a fresh Debian host.

Every key is declared once, in the dataclasses below; their field types drive
validation, so an unknown key or a wrong type is reported with its dotted name. Every
number is declared with its range (`number`) and every path with its kind (`filepath`)
next to its default, and `validate` checks them all, at start and at every
reload alike: a number must be finite and in range, a path of its kind.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from pycri import conffiles, procs

DEFAULT_CONFIG_PATH = Path("/etc/pycri/pycri.toml")


class ConfigError(Exception):
    """A configuration problem, worded as one line naming the key."""


KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
# Path kinds: absolute; absolute or "" (unset); absolute and normalised (no `..`,
# no `//`, compared as strings); a command (absolute, or a name looked up in PATH).
ABSOLUTE, OPTIONAL, NORMALISED, COMMAND = "absolute", "optional", "normalised", "command"


def number(default: float, lo: float, hi: float) -> Any:
    """A number key with its sane range (inclusive)."""
    return field(default=default, metadata={"range": (lo, hi)})


def filepath(default: str, kind: str = ABSOLUTE) -> Any:
    """A path key and what kind of path it must be (a list of paths: `field` with
    `metadata={"path": kind}`, each entry checked)."""
    return field(default=default, metadata={"path": kind})


@dataclass
class RuntimeHandler:
    """One OCI runtime a RuntimeClass can select (`runtime_handler` in the CRI)."""

    path: str = filepath("", COMMAND)
    root: str = filepath("", OPTIONAL)  # empty: <state>/<handler name>
    type: str = "oci"
    # Seconds any one call of the runtime (create, start, kill, state, ...) may take
    # before it is killed with its process group and the RPC fails DeadlineExceeded.
    timeout: float = number(60.0, 1, 3600)


@dataclass
class CNIConfig:
    conf_dir: str = filepath("/etc/cni/net.d")
    bin_dirs: list[str] = field(default_factory=lambda: ["/opt/cni/bin", "/usr/lib/cni"],
                                metadata={"path": ABSOLUTE})
    # Use the conflist shipped in pycri/data/ when conf_dir holds none.
    default_network: bool = True
    default_subnet: str = "10.85.0.0/16"
    default_bridge: str = "pycri0"
    # Seconds one plugin call (ADD or DEL) may take before it is killed.
    plugin_timeout: float = number(60.0, 1, 3600)


@dataclass
class ImagesConfig:
    registries_conf: str = filepath("/etc/containers/registries.conf", OPTIONAL)
    registries_conf_dir: str = filepath("/etc/containers/registries.conf.d", OPTIONAL)
    ca_file: str = filepath("", OPTIONAL)
    connect_timeout: float = number(10.0, 0.1, 600)
    read_timeout: float = number(30.0, 0.1, 3600)
    # A pull that makes no progress for this long fails (the kubelet sets no deadline):
    # a manifest must arrive whole within it, a blob 1 MiB at least per period.
    pull_progress_timeout: float = number(60.0, 1, 3600)
    max_concurrent_downloads: int = number(3, 1, 64)
    # Distinct pulls at once (one reference with the same credentials is one pull): each
    # may hold a few registry documents of up to 4 MiB, so past it a new one is refused
    # (RESOURCE_EXHAUSTED) rather than grow the daemon with every client that asks.
    max_concurrent_pulls: int = number(32, 1, 4096)
    # Decompression bombs: a layer may unpack to at most ratio x its compressed size (but
    # always to min_layer_unpacked_bytes). Real layers expand 2-10x; gzip cannot exceed
    # ~1030x. No download or unpack goes into the last reserve bytes of the image fs.
    max_layer_expansion_ratio: float = number(100.0, 1, 1_000_000)
    min_layer_unpacked_bytes: int = number(64 * MiB, 0, TiB)
    free_space_reserve: int = number(256 * MiB, 0, TiB)
    # A layer's compressed blob once the layer is unpacked and its diff ID checked: kept,
    # an image costs its compressed size on top of its unpacked one; dropped (the
    # default, as CRI-O does), a pull of another image with that layer on another base
    # fetches it again.
    keep_layer_blobs: bool = False


@dataclass
class StreamingConfig:
    """Bounds on the unauthenticated streaming port and on each SPDY or WebSocket session."""

    # Connections of any kind, and those still sending their request head (no token yet).
    max_connections: int = number(512, 1, 1 << 20)
    max_pending: int = number(128, 1, 1 << 20)
    max_pending_per_peer: int = number(64, 1, 1 << 20)
    # Seconds a client gets to send its whole request head, and to open its exec streams.
    header_timeout: float = number(5.0, 0.1, 600)
    stream_timeout: float = number(15.0, 0.1, 600)
    # Per session: streams of every kind (open, half-closed, not yet accepted), and the
    # bytes received but not yet consumed (all streams together).
    max_streams: int = number(128, 1, 1 << 16)
    max_session_buffer: int = number(16 * MiB, 64 * KiB, GiB)
    # The same for all sessions together: past it, their reads wait, new streaming
    # requests are refused (RESOURCE_EXHAUSTED) and new connections wait to be accepted.
    max_buffer_total: int = number(128 * MiB, 64 * KiB, 64 * GiB)
    # Concurrent forwarded connections per port-forward session.
    max_port_forward_connections: int = number(64, 1, 1 << 16)
    # File descriptors the streaming server may hold (connections plus forwarded
    # connections); clamped so at least `fd_reserve` of RLIMIT_NOFILE stay for the rest.
    max_fds: int = number(8192, 1, 1 << 24)
    fd_reserve: int = number(1024, 1, 1 << 24)


@dataclass
class MetricsConfig:
    """Bounds on the /metrics listener (`metrics_address`), open to every local user."""

    # Connections in all and per peer address; more are closed at once.
    max_connections: int = number(64, 1, 1 << 16)
    max_connections_per_peer: int = number(16, 1, 1 << 16)
    # Seconds a client gets to send its whole request head, and to take the answer.
    header_timeout: float = number(5.0, 0.1, 600)
    send_timeout: float = number(10.0, 0.1, 600)


@dataclass
class HelpersConfig:
    """Helper processes pycri starts itself (runtime CLI calls, CNI plugins, conmon)."""

    # How many run at once; more wait their turn. A burst of forks on the event loop
    # (hundreds of `runtime state` at recovery) starves it and floods it with exits.
    max_concurrent: int = number(procs.DEFAULT_MAX_CONCURRENT, 1, 1024)


@dataclass
class CDIConfig:
    """Where CDI spec files are found (issue 11): later dirs override earlier ones."""

    spec_dirs: list[str] = field(default_factory=lambda: ["/etc/cdi", "/var/run/cdi"],
                                 metadata={"path": ABSOLUTE})
    # Bounds on what one resolve reads: bytes per spec file, spec files per dir.
    max_spec_bytes: int = number(MiB, 1, 64 * MiB)
    max_spec_files: int = number(256, 1, 1 << 16)


@dataclass
class ListsConfig:
    """How the Stream* lists (StreamContainers, StreamImages, ...) chunk their answer:
    a message holds at most `stream_chunk_items` entries and about `stream_chunk_bytes`
    serialized, far below the 16 MiB a gRPC client receives by default."""

    stream_chunk_items: int = number(1000, 1, 10_000)
    stream_chunk_bytes: int = number(4 * MiB, KiB, 8 * MiB)


@dataclass
class CheckpointConfig:
    """Checkpoint/restore with CRIU (CheckpointContainer, CheckpointPod, RestorePod)."""

    # The criu binary the runtime is told to use; probed once (`criu check`) when first needed.
    criu: str = filepath("/usr/sbin/criu", COMMAND)
    # Seconds `criu check` (and each runtime's checkpoint probe) may take.
    check_timeout: float = number(30.0, 1, 3600)
    # The only directories checkpoint archives are written to and read from (the
    # daemon runs as root: a request must not name any file on the host). kubelet
    # writes to /var/lib/kubelet/checkpoints.
    archive_dirs: list[str] = field(
        default_factory=lambda: ["/var/lib/kubelet/checkpoints", "/var/lib/pycri/checkpoints"],
        metadata={"path": NORMALISED})
    # Seconds a dump or restore may take when the request gives no timeout.
    timeout: float = number(300.0, 1, 86400)
    # Bytes one archive may hold (CRIU's images plus the rootfs changes), written or read.
    max_archive_bytes: int = number(8 * GiB, MiB, 16 * TiB)
    # CreateContainer of a pulled image marked as a checkpoint restores it. Off: anyone
    # who can push an image can write CRIU images (docs/operating.md says what they
    # could still do); archives come only from `archive_dirs`, which root controls.
    restore_from_images: bool = False


@dataclass
class NRIConfig:
    """The Node Resource Interface: plugins that see and adjust every pod and container."""

    enable: bool = True
    # Where external plugins connect (mode 0600, owned by root).
    socket_path: str = filepath("/var/run/nri/nri.sock")
    # Pre-installed plugins pycri starts itself (named IDX-NAME), and their config files.
    plugin_path: str = filepath("/opt/nri/plugins")
    plugin_config_path: str = filepath("/etc/nri/conf.d")
    # Seconds a plugin has to register after connecting, and to answer any one request;
    # a plugin past either is disconnected and the operation goes on without it.
    registration_timeout: float = number(5.0, 0.1, 300)
    request_timeout: float = number(2.0, 0.1, 300)
    # Only pre-installed plugins: no socket is listened on.
    disable_connections: bool = False


@dataclass
class CadvisorConfig:
    """The door the kubelet's built-in cAdvisor reads pycri's containers through: the
    containerd calls its containerd plugin makes (issue 44, pycri/cadvisor/)."""

    # The door's socket is <state>/cadvisor/containerd.sock, in a directory pycri makes
    # for it and only root may enter (no key moves it: a directory shared with anything
    # else could not be kept so). A kubelet whose default path is taken: --containerd=.
    enable: bool = True
    # The path cAdvisor dials when the kubelet names none. pycri links it to its door
    # when no containerd serves it (and removes its link at stop); empty: never.
    default_path: str = filepath("/run/containerd/containerd.sock", OPTIONAL)
    # Calls in flight at once; more are answered RESOURCE_EXHAUSTED.
    max_concurrent_calls: int = number(16, 1, 1024)


@dataclass
class Config:
    root: str = filepath("/var/lib/pycri")
    state: str = filepath("/run/pycri")
    socket: str = filepath("", OPTIONAL)  # empty: <state>/pycri.sock
    log_level: str = "info"
    log_format: str = "text"
    default_runtime: str = "runc"
    cgroup_driver: str = "cgroupfs"
    conmon: str = filepath("/usr/bin/conmon", COMMAND)
    infra_binary: str = filepath("/usr/bin/catatonit", COMMAND)
    pause_image: str = ""  # empty: the built-in infra (no image)
    streaming_address: str = "127.0.0.1:0"
    # Clamp containers' oom_score_adj to the daemon's own (root lacks CAP_SYS_RESOURCE here).
    restrict_oom_score_adj: bool = True
    # Prometheus /metrics on host:port (e.g. "127.0.0.1:9090"); empty: no endpoint.
    metrics_address: str = ""
    runtimes: dict[str, RuntimeHandler] = field(
        default_factory=lambda: {
            "runc": RuntimeHandler(path="/usr/sbin/runc"),
            "crun": RuntimeHandler(path="/usr/bin/crun"),
        }
    )
    cni: CNIConfig = field(default_factory=CNIConfig)
    images: ImagesConfig = field(default_factory=ImagesConfig)
    streaming: StreamingConfig = field(default_factory=StreamingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    helpers: HelpersConfig = field(default_factory=HelpersConfig)
    cdi: CDIConfig = field(default_factory=CDIConfig)
    lists: ListsConfig = field(default_factory=ListsConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    nri: NRIConfig = field(default_factory=NRIConfig)
    cadvisor: CadvisorConfig = field(default_factory=CadvisorConfig)

    # Paths derived from root/state; the only place that lays them out.
    @property
    def socket_path(self) -> Path:
        return Path(self.socket) if self.socket else Path(self.state) / "pycri.sock"

    @property
    def cadvisor_socket(self) -> Path:
        return Path(self.state) / "cadvisor" / "containerd.sock"

    @property
    def db_path(self) -> Path:
        return Path(self.root) / "pycri.db"

    def runtime_root(self, handler: str) -> Path:
        h = self.runtimes[handler]
        return Path(h.root) if h.root else Path(self.state) / handler


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
CGROUP_DRIVERS = ("cgroupfs", "systemd")
RUNTIME_TYPES = ("oci",)


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; build nested dataclasses."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {type(value).__name__}")
        return _build(tp, value, key)
    if origin is dict:
        _, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {type(value).__name__}")
        return {k: _convert(v, vt, f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        (et,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected an array, got {type(value).__name__}")
        return [_convert(v, et, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {_kind(value)}")
        return float(value)
    if tp in (int, str, bool):
        if type(value) is not tp:
            raise ConfigError(f"{key}: expected {tp.__name__}, got {_kind(value)}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - schema bug


def _kind(value: Any) -> str:
    """What a wrong value is, without repeating it (the file's contents stay out)."""
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)


def _build(cls: Any, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        if k not in names:
            raise ConfigError(f"{key}: unknown key")
        kwargs[k] = _convert(v, hints[k], key)
    obj = cls(**kwargs)
    # A [runtimes.X] table replaces the default set only for the names it gives.
    if cls is Config and "runtimes" in data:
        merged = Config().runtimes
        merged.update(obj.runtimes)
        obj.runtimes = merged
    return obj


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}: must be one of {', '.join(allowed)}")


def _check_number(key: str, value: float, lo: float, hi: float) -> None:
    if not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number")
    if not lo <= value <= hi:
        raise ConfigError(f"{key}: must be within {lo:g}..{hi:g}" if isinstance(lo, float)
                          else f"{key}: must be within {lo}..{hi}")


def _check_path(key: str, value: str, kind: str) -> None:
    if "\0" in value:
        raise ConfigError(f"{key}: must not contain a NUL byte")
    if kind == OPTIONAL and not value:
        return
    if kind == COMMAND and "/" not in value:
        return  # a name looked up in PATH, or unset: the checks of binaries say which
    if not os.path.isabs(value):
        raise ConfigError(f"{key}: must be an absolute path")
    if kind == NORMALISED and os.path.normpath(value) != value:
        raise ConfigError(f"{key}: must be a normalised path (no '..', '.' or '//')")


def _check_fields(obj: Any, prefix: str) -> None:
    """Every `number` and `path` key of the dataclass `obj` (and of those it holds)."""
    for f in dataclasses.fields(obj):
        key, value = f"{prefix}{f.name}", getattr(obj, f.name)
        if "range" in f.metadata:
            _check_number(key, value, *f.metadata["range"])
        elif "path" in f.metadata:
            for i, p in enumerate([value] if isinstance(value, str) else value):
                _check_path(key if isinstance(value, str) else f"{key}[{i}]", p,
                            f.metadata["path"])
        elif dataclasses.is_dataclass(value):
            _check_fields(value, f"{key}.")
        elif isinstance(value, dict):
            for name, v in value.items():
                if dataclasses.is_dataclass(v):
                    _check_fields(v, f"{key}.{name}.")


def validate(cfg: Config, check_binaries: bool = True) -> None:
    """Reject values that would only fail later, naming the key."""
    _check_fields(cfg, "")
    _choice("log_level", cfg.log_level, LOG_LEVELS)
    _choice("log_format", cfg.log_format, LOG_FORMATS)
    _choice("cgroup_driver", cfg.cgroup_driver, CGROUP_DRIVERS)
    if cfg.default_runtime not in cfg.runtimes:
        raise ConfigError("default_runtime: names no [runtimes] handler")
    for name, h in cfg.runtimes.items():
        _choice(f"runtimes.{name}.type", h.type, RUNTIME_TYPES)
        if not h.path:
            raise ConfigError(f"runtimes.{name}.path: must be set")
    if cfg.streaming.max_pending > cfg.streaming.max_connections:
        raise ConfigError("streaming.max_pending: must not exceed streaming.max_connections")
    if cfg.metrics_address:
        host, sep, port = cfg.metrics_address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError("metrics_address: expected host:port (port 1-65535)")
    if check_binaries:
        # Only the default handler must exist: a host without crun still runs pods with
        # runc; a pod asking for a missing handler gets a clear error, `pycri check` says why.
        default = cfg.runtimes[cfg.default_runtime]
        binaries = {f"runtimes.{cfg.default_runtime}.path": default.path}
        binaries["conmon"] = cfg.conmon
        if not cfg.pause_image:
            binaries["infra_binary"] = cfg.infra_binary
        for key, binary in binaries.items():
            if not _is_executable(binary):
                raise ConfigError(f"{key}: {binary!r} is not an executable file")


def _is_executable(path: str) -> bool:
    resolved = path if os.path.isabs(path) else shutil.which(path)
    return bool(resolved) and os.path.isfile(str(resolved)) and os.access(str(resolved), os.X_OK)


def load(path: Path | None, overrides: dict[str, Any] | None = None) -> Config:
    """Read the TOML file (absent default path = defaults), apply CLI overrides."""
    data: dict[str, Any] = {}
    if path is None:
        path = DEFAULT_CONFIG_PATH
        required = False
    else:
        required = True
    try:
        data = conffiles.load_toml(path)
    except FileNotFoundError:
        if required:
            raise ConfigError(f"config file {path}: not found") from None
    except ValueError as e:
        raise ConfigError(f"config file {path}: {e}") from None
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror or type(e).__name__}") from None
    for k, v in (overrides or {}).items():
        if v is not None:
            data[k] = v
    cfg: Config = _build(Config, data)
    return cfg


def to_toml(cfg: Config) -> str:
    """The effective configuration, derived defaults filled in."""
    data = dataclasses.asdict(cfg)
    data["socket"] = str(cfg.socket_path)
    for name in cfg.runtimes:
        data["runtimes"][name]["root"] = str(cfg.runtime_root(name))
    return tomli_w.dumps(data)


__all__ = [
    "CDIConfig",
    "CNIConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "HelpersConfig",
    "ImagesConfig",
    "MetricsConfig",
    "NRIConfig",
    "RuntimeHandler",
    "StreamingConfig",
    "load",
    "to_toml",
    "validate",
]
