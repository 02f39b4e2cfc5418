"""Config: defaults, overrides, and one clear line naming the bad key."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pycri.config import Config, ConfigError, RuntimeHandler, load, to_toml, validate


def test_defaults_work_on_this_host() -> None:
    cfg = load(None)
    validate(cfg)  # runc, crun, conmon and catatonit are installed by the setup script
    assert cfg.root == "/var/lib/pycri"
    assert cfg.socket_path == Path("/run/pycri/pycri.sock")
    assert cfg.runtime_root("runc") == Path("/run/pycri/runc")
    assert cfg.cni.bin_dirs == ["/opt/cni/bin", "/usr/lib/cni"]
    assert cfg.pause_image == ""


def test_overrides_and_derived_paths(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('log_level = "debug"\n[runtimes.runc]\npath = "/usr/sbin/runc"\n')
    cfg = load(f, {"state": str(tmp_path / "st"), "root": None})
    assert cfg.log_level == "debug"
    assert cfg.socket_path == tmp_path / "st" / "pycri.sock"
    assert cfg.runtime_root("runc") == tmp_path / "st" / "runc"
    # A [runtimes.X] table adds to the defaults instead of dropping crun.
    assert set(cfg.runtimes) == {"runc", "crun"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus = 1\n", "bogus: unknown key"),
        ("[cni]\nconf_dirr = 'x'\n", "cni.conf_dirr: unknown key"),
        ("log_level = 3\n", "log_level: expected str"),
        ("[images]\nconnect_timeout = 'x'\n", "images.connect_timeout: expected a number"),
        ("[cni]\nbin_dirs = 'x'\n", "cni.bin_dirs: expected an array"),
        ("[runtimes.kata]\npath = 7\n", "runtimes.kata.path: expected str"),
        ("root = [\n", "config file"),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load(f)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"log_level": "loud"}, "log_level: must be one of debug, info"),
        ({"cgroup_driver": "cgroupv3"}, "cgroup_driver:"),
        ({"default_runtime": "kata"}, "default_runtime: names no \\[runtimes\\]"),
        ({"root": "relative/dir"}, "root: must be an absolute path"),
        ({"conmon": "/nonexistent/conmon"}, "conmon: '/nonexistent/conmon' is not an executable"),
    ],
)
def test_validation_names_the_key(change: dict[str, str], message: str) -> None:
    cfg = Config(**change)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[streaming]\nmax_streams = 0\n", "streaming.max_streams: must be within 1.."),
        ("[streaming]\nheader_timeout = -1\n", "streaming.header_timeout: must be within 0.1.."),
        ("[streaming]\nmax_pending = 600\n", "streaming.max_pending: must not exceed"),
        ("[streaming]\nmax_fds = 'many'\n", "streaming.max_fds: expected int"),
        ("[lists]\nstream_chunk_items = 0\n", "lists.stream_chunk_items: must be within"),
        ("[lists]\nstream_chunk_bytes = 33554432\n", "lists.stream_chunk_bytes: must be within"),
    ],
)
def test_streaming_bounds_are_checked(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        validate(load(f), check_binaries=False)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[runtimes.runc]\npath = '/usr/sbin/runc'\ntimeout = 0\n",
         r"runtimes\.runc\.timeout: must be within 1\.\."),
        ("[cni]\nplugin_timeout = -1\n", r"cni\.plugin_timeout: must be within 1\.\."),
        ("[nri]\nrequest_timeout = 0\n", r"nri\.request_timeout: must be within 0\.1\.\."),
        ("[nri]\nregistration_timeout = -5\n", r"nri\.registration_timeout: must be within"),
        ("[nri]\nsocket_path = 'nri.sock'\n", r"nri\.socket_path: must be an absolute path"),
        ("[nri]\nenable = 'yes'\n", r"nri\.enable: expected bool"),
        ("[nri]\nsocket = '/x'\n", r"nri\.socket: unknown key"),
    ],
)
def test_helper_deadlines_are_checked(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        validate(load(f), check_binaries=False)


def test_missing_runtime_binary_is_reported() -> None:
    cfg = Config()
    cfg.runtimes["runc"].path = "/nonexistent/runc"
    with pytest.raises(ConfigError, match=r"runtimes\.runc\.path"):
        validate(cfg)


def test_only_the_default_handler_must_be_installed() -> None:
    cfg = Config()
    cfg.runtimes["crun"].path = "/nonexistent/crun"  # a host without crun still starts
    validate(cfg)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[images]\nmax_layer_expansion_ratio = 0\n", "images.max_layer_expansion_ratio: must be"),
        ("[images]\nmin_layer_unpacked_bytes = -1\n", "images.min_layer_unpacked_bytes: must be"),
        ("[images]\nfree_space_reserve = -1\n", "images.free_space_reserve: must be within 0.."),
    ],
)
def test_image_bounds_are_checked(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        validate(load(f), check_binaries=False)


def test_explicit_config_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load(tmp_path / "absent.toml")


def test_effective_config_round_trips(tmp_path: Path) -> None:
    text = to_toml(load(None, {"state": "/run/x"}))
    data = tomllib.loads(text)
    assert data["socket"] == "/run/x/pycri.sock"
    assert data["runtimes"]["crun"]["root"] == "/run/x/crun"
    f = tmp_path / "again.toml"
    f.write_text(text)
    assert to_toml(load(f)) == text


def test_cli_config_error_exits_2_with_one_line(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[images]\nmax_concurrent_downloads = 0\n")
    out = subprocess.run(
        [sys.executable, "-m", "pycri", "serve", "--config", str(f)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "pycri: config: images.max_concurrent_downloads: must be within 1..64"
    ]


def test_cli_config_prints_effective_toml() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pycri", "config", "--root", "/srv/pycri"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert tomllib.loads(out.stdout)["root"] == "/srv/pycri"


@pytest.mark.parametrize("address", ["9090", ":9090", "127.0.0.1:0", "127.0.0.1:70000",
                                     "localhost:http"])
def test_metrics_address_must_be_host_and_port(address: str) -> None:
    cfg = Config(metrics_address=address)
    with pytest.raises(ConfigError, match=r"metrics_address: expected host:port"):
        validate(cfg, check_binaries=False)


def test_metrics_are_off_by_default() -> None:
    assert Config().metrics_address == ""
    validate(Config(metrics_address="[::1]:9090"), check_binaries=False)


def _numbers(cls: type, prefix: str) -> list[tuple[str, str, type]]:
    """(table, key, type) of every number key under the dataclass `cls`."""
    import dataclasses
    import typing

    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            out += _numbers(tp, f.name)  # type: ignore[arg-type]
        elif tp in (int, float):
            out.append((prefix, f.name, tp))
    return out


NUMBERS = _numbers(Config, "") + [("runtimes.runc", k, t) for _, k, t in
                                  _numbers(RuntimeHandler, "runtimes.runc")]
HOSTILE_NUMBERS = ["nan", "inf", "-inf", "9223372036854775807", "-9223372036854775808"]


@pytest.mark.parametrize(("table", "key", "tp"), NUMBERS)
def test_every_number_is_finite_and_in_its_range(tmp_path: Path, table: str, key: str,
                                                 tp: type) -> None:  # fmt: skip
    """Issue 22, defect 6: nan, inf and the int64 bounds are refused, naming the key;
    the default is inside the range."""
    dotted = f"{table}.{key}" if table else key
    head = f"[{table}]\n" + ("path = '/usr/sbin/runc'\n" if table.startswith("runtimes") else "")
    f = tmp_path / "c.toml"
    for value in HOSTILE_NUMBERS:
        f.write_text(f"{head}{key} = {value}\n")
        with pytest.raises(ConfigError, match=rf"^{re.escape(dotted)}: "):
            validate(load(f), check_binaries=False)
    f.write_text(head)
    validate(load(f), check_binaries=False)


@pytest.mark.parametrize("text", [
    "root = 'var/lib/pycri'", "state = ''", "socket = 'pycri.sock'",
    "[cni]\nconf_dir = 'net.d'", "[cni]\nbin_dirs = ['/opt/cni/bin', 'bin']",
    "[images]\nregistries_conf = 'registries.conf'", "[images]\nca_file = 'ca.pem'",
    "[cdi]\nspec_dirs = ['/etc/cdi', 'cdi']", "[checkpoint]\narchive_dirs = ['/a/../b']",
    "[nri]\nplugin_config_path = 'conf.d'", 'root = "/var/lib/\\u0000pycri"',
])
def test_paths_must_be_of_their_kind(tmp_path: Path, text: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text + "\n")
    key = text.split("=")[0].strip().replace("[", "").replace("]\n", ".")
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}(\[\d+\])?: "):
        validate(load(f), check_binaries=False)


def test_start_refuses_an_out_of_range_value_naming_the_key(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[cdi]\nmax_spec_bytes = 9223372036854775807\n")
    out = subprocess.run([sys.executable, "-m", "pycri", "serve", "--config", str(f)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("pycri: config: cdi.max_spec_bytes: must be within 1.."), line
