"""The hostile corpus and generated input for the doors that are not CRI calls (issue
22, item 11; tests/lib/doors.py): CDI spec files, pycri.toml, registries.conf and the
/metrics listener. Each file gets a clear error of its door's class naming the file,
never the secret it carries, and nothing else is raised; every request to the listener
gets a status line (or a hang-up) and the listener keeps serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pycri import metrics
from pycri.cdi import registry as cdi_registry
from pycri.cdi.schema import SpecError, parse_spec
from pycri.config import ConfigError, MetricsConfig, load, validate
from pycri.errors import InvalidArgument
from pycri.image.regconf import RegistriesConf
from pycri.metrics_listener import MetricsListener
from pycri.network import conf as cni_conf
from tests.lib import doors
from tests.lib.doors import SECRET

EXAMPLES = int(os.environ.get("PYCRI_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


# -- CDI spec files --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(doors.CDI_SPECS))
@pytest.mark.parametrize("linked", [False, True])
def test_cdi_spec_corpus(tmp_path: Path, name: str, linked: bool) -> None:
    """Each hostile spec, as a file or as a link to it: the device of its kind and an
    unknown device are refused naming the file, never quoting it."""
    d = tmp_path / "cdi"
    d.mkdir()
    target = tmp_path / "target" if linked else d / name
    target.write_bytes(doors.CDI_SPECS[name])
    if linked:
        (d / name).symlink_to(target)
    reg = cdi_registry.Registry([str(d)], 1 << 20, 16)
    for device in ("vendor.com/dev=a", "other.com/x=y"):
        try:
            reg.resolve([device])
        except InvalidArgument as e:
            assert SECRET not in str(e), str(e)
            if device.startswith("vendor") and name not in doors.OTHER_KIND:
                assert f"{d / name}: " in str(e), str(e)
        else:
            raise AssertionError(f"{name}: {device} resolved")


@FUZZ
@given(doc=doors.spec_documents())
def test_generated_spec_documents(doc: Any) -> None:
    try:
        parse_spec(doc)
    except SpecError as e:
        assert SECRET not in str(e), str(e)


@FUZZ
@given(data=doors.config_texts())
def test_generated_bytes_as_spec_files(data: bytes) -> None:
    for name in ("x.yaml", "x.json"):
        try:
            parse_spec(cdi_registry.decode(name, data))
        except SpecError as e:
            assert SECRET not in str(e), str(e)


# -- config files -----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(doors.CONFIGS))
def test_config_corpus(tmp_path: Path, name: str) -> None:
    f = tmp_path / "pycri.toml"
    f.write_bytes(doors.CONFIGS[name])
    with pytest.raises(ConfigError) as e:
        validate(load(f), check_binaries=False)
    assert SECRET not in str(e.value), str(e.value)


def test_a_config_linked_to_a_secret_is_named_at_start(tmp_path: Path) -> None:
    (tmp_path / "shadow").write_bytes(doors.SHADOW)
    (tmp_path / "pycri.toml").symlink_to(tmp_path / "shadow")
    out = subprocess.run([sys.executable, "-m", "pycri", "serve", "--config",
                          str(tmp_path / "pycri.toml")],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"pycri: config: config file {tmp_path / 'pycri.toml'}: not valid TOML "
        "(at line 1, column 5)"], out.stderr


@FUZZ
@given(data=st.one_of(doors.config_texts(), doors.config_documents()))
def test_generated_config_files(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    """Known keys given generated values, and (issue 41, item 4) a real config mutated
    in one to three places."""
    f = tmp_path_factory.mktemp("cfg") / "pycri.toml"
    f.write_bytes(data)
    try:
        validate(load(f), check_binaries=False)
    except ConfigError as e:
        assert SECRET not in str(e), str(e)


@pytest.mark.parametrize("name", sorted(doors.REGISTRIES))
def test_registries_conf_corpus(tmp_path: Path, name: str) -> None:
    f = tmp_path / "registries.conf"
    f.write_bytes(doors.REGISTRIES[name])
    with pytest.raises(InvalidArgument) as e:
        RegistriesConf.load(str(f))
    assert SECRET not in str(e.value) and str(f) in str(e.value), str(e.value)


@FUZZ
@given(data=doors.registries_texts())
def test_mutated_real_registries_confs(tmp_path_factory: pytest.TempPathFactory,
                                       data: bytes) -> None:
    """Issue 41, item 4: as the main file, InvalidArgument naming it or a configuration;
    as a drop-in beside a good main file, skipped or used, never raised."""
    d = tmp_path_factory.mktemp("reg")
    main, dropins = d / "registries.conf", d / "registries.conf.d"
    main.write_bytes(data)
    try:
        RegistriesConf.load(str(main))
    except InvalidArgument as e:
        assert SECRET not in str(e) and str(main) in str(e), str(e)
    dropins.mkdir()
    (dropins / "50-fuzz.conf").write_bytes(data)
    main.write_text(doors.toml_text(doors.REGISTRIES_DOC))
    RegistriesConf.load(str(main), str(dropins))


# -- CNI conflists ------------------------------------------------------------------------


@FUZZ
@given(data=doors.conflists())
def test_mutated_real_conflists(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    """Issue 41, item 4: a conflist is a network or a ValueError saying why, never
    another error and never the secret it carries; in a conf dir it is skipped."""
    d = tmp_path_factory.mktemp("cni")
    f = d / "10-fuzz.conflist"
    f.write_bytes(data)
    try:
        cni_conf.load_file(f)
    except ValueError as e:
        assert SECRET not in str(e), str(e)
    (d / "20-good.conflist").write_text(json.dumps(doors.CONFLIST))
    assert cni_conf.find_network(d) is not None


# -- the /metrics listener ----------------------------------------------------------------


@pytest.fixture(scope="module")
def listener() -> Iterator[tuple[str, int]]:
    srv = MetricsListener("127.0.0.1:0", MetricsConfig(header_timeout=1.0, send_timeout=2.0),
                          metrics.REGISTRY.prometheus())
    srv.start()
    try:
        yield "127.0.0.1", srv.port
    finally:
        srv.stop()


@pytest.mark.parametrize("name", sorted(doors.REQUESTS))
def test_metrics_request_corpus(listener: tuple[str, int], name: str) -> None:
    data, statuses = doors.REQUESTS[name]
    assert doors.exchange(listener, data, 10) in statuses
    assert doors.exchange(listener, doors.REQUESTS["scrape"][0], 10) == 200


@FUZZ
@given(data=doors.requests())
def test_generated_metrics_requests(listener: tuple[str, int], data: bytes) -> None:
    status = doors.exchange(listener, data, 10)
    assert status is None or status in (200, 400, 404, 405), status


def test_the_listener_thread_survives_the_fuzzing(listener: tuple[str, int]) -> None:
    assert doors.exchange(listener, doors.REQUESTS["scrape"][0], 10) == 200
    assert [t.name for t in threading.enumerate()].count("metrics") == 1
