"""devices.py: device nodes read from the host (/dev/null, directories of devices,
the host's /dev) and what is not a device."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from pycri.devices import device_info, host_devices, resolve_device
from pycri.errors import InvalidArgument

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make device nodes")


def test_device_info_dev_null() -> None:
    d = device_info("/dev/null", "/dev/mynull", "rw")
    assert (d.path, d.type, d.major, d.minor, d.permissions) == ("/dev/mynull", "c", 1, 3, "rw")
    assert d.file_mode == stat.S_IMODE(os.stat("/dev/null").st_mode)


def test_device_info_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="not a device"):
        device_info(str(tmp_path))
    with pytest.raises(InvalidArgument, match="missing"):
        device_info(str(tmp_path / "missing"))
    with pytest.raises(InvalidArgument, match="permissions"):
        device_info("/dev/null", permissions="rwx")
    # Found by fuzzing: a FIFO became device type "p", which runc refused (UNKNOWN).
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InvalidArgument, match="not a device"):
        device_info(str(tmp_path / "fifo"))


@root_only
def test_resolve_device_directory(tmp_path: Path) -> None:
    devdir = tmp_path / "snd"
    (devdir / "sub").mkdir(parents=True)
    os.mknod(devdir / "a", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(devdir / "sub" / "b", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    (devdir / "plain").write_text("")
    out = resolve_device(pb.Device(host_path=str(devdir), container_path="/dev/snd",
                                   permissions="r"))  # fmt: skip
    assert [(d.path, d.minor, d.permissions) for d in out] == [
        ("/dev/snd/a", 3, "r"),
        ("/dev/snd/sub/b", 5, "r"),
    ]


def test_resolve_single_device_defaults() -> None:
    (d,) = resolve_device(pb.Device(host_path="/dev/zero"))
    assert (d.path, d.major, d.minor, d.permissions) == ("/dev/zero", 1, 5, "rwm")
    with pytest.raises(InvalidArgument, match="absolute"):
        resolve_device(pb.Device(host_path="/dev/zero", container_path="zero"))


def test_host_devices() -> None:
    devs = {d.path: d for d in host_devices()}
    assert devs["/dev/null"].major == 1
    assert not any(p.startswith(("/dev/pts/", "/dev/shm/")) for p in devs)
