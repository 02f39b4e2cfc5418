"""CRI `Signal` values to signal numbers and back (ContainerConfig/ContainerStatus
.stop_signal): every value the proto defines maps to a real signal and back to itself,
except the kernel's aliases, which come back as the name the kernel gives them."""

from __future__ import annotations

import signal

import pytest

from pycri.api import api_pb2 as pb
from pycri.container.signals import cri_signal, parse_signal, signal_of_cri
from pycri.errors import InvalidArgument

ALIASES = {"SIGNAL_SIGCLD": "SIGNAL_SIGCHLD", "SIGNAL_SIGIOT": "SIGNAL_SIGABRT",
           "SIGNAL_SIGPOLL": "SIGNAL_SIGIO"}


def test_every_cri_signal_round_trips() -> None:
    for value in pb.Signal.values():
        if value == pb.SIGNAL_RUNTIME_DEFAULT:
            continue
        name = pb.Signal.Name(value)
        signum = parse_signal(signal_of_cri(value))
        assert 1 <= signum <= signal.SIGRTMAX, name
        assert pb.Signal.Name(cri_signal(signum)) == ALIASES.get(name, name)


def test_real_time_signals_and_the_default() -> None:
    assert parse_signal(signal_of_cri(pb.SIGNAL_SIGRTMINPLUS3)) == signal.SIGRTMIN + 3
    assert parse_signal(signal_of_cri(pb.SIGNAL_SIGRTMAXMINUS1)) == signal.SIGRTMAX - 1
    assert signal_of_cri(pb.SIGNAL_RUNTIME_DEFAULT) == ""  # the image's, else SIGTERM
    assert cri_signal(parse_signal("")) == pb.SIGNAL_SIGTERM
    assert cri_signal(0) == pb.SIGNAL_RUNTIME_DEFAULT


def test_an_image_stopsignal_by_name_short_name_or_number() -> None:
    assert parse_signal("SIGQUIT") == parse_signal("quit") == parse_signal("3") == signal.SIGQUIT
    with pytest.raises(InvalidArgument, match="unknown stop signal 'SIGNOPE'"):
        parse_signal("SIGNOPE")
