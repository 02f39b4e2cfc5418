"""Stop signals: an image's STOPSIGNAL and the CRI `Signal` enum as signal numbers,
and back (what ContainerStatus.stop_signal reports).
"""

from __future__ import annotations

import signal

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument


def parse_signal(name: str) -> int:
    """An image STOPSIGNAL ("SIGQUIT", "QUIT", "3") as a number; SIGTERM if unset."""
    if not name:
        return signal.SIGTERM
    if name.isdigit():
        return int(name)
    sig = name.upper()
    if not sig.startswith("SIG"):
        sig = "SIG" + sig
    try:
        return int(signal.Signals[sig])
    except KeyError:
        raise InvalidArgument(f"unknown stop signal {name!r}") from None


_RT_PLUS, _RT_MINUS = "SIGRTMINPLUS", "SIGRTMAXMINUS"


def signal_of_cri(value: int) -> str:
    """A CRI `Signal` (ContainerConfig.stop_signal) as the number parse_signal takes;
    "" for RUNTIME_DEFAULT (the image's STOPSIGNAL, else SIGTERM)."""
    if not value:
        return ""
    name = pb.Signal.Name(value).removeprefix("SIGNAL_")
    if name.startswith(_RT_PLUS):
        return str(signal.SIGRTMIN + int(name.removeprefix(_RT_PLUS)))
    if name.startswith(_RT_MINUS):
        return str(signal.SIGRTMAX - int(name.removeprefix(_RT_MINUS)))
    return str(int(signal.Signals[name]))


def cri_signal(signum: int) -> int:
    """The CRI `Signal` of a signal number (ContainerStatus.stop_signal); real-time
    signals by their distance from SIGRTMIN or SIGRTMAX, as the CRI names them."""
    lo, hi = int(signal.SIGRTMIN), int(signal.SIGRTMAX)
    if lo < signum <= lo + 15:
        name = f"{_RT_PLUS}{signum - lo}"
    elif hi - 14 <= signum < hi:
        name = f"{_RT_MINUS}{hi - signum}"
    else:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            return pb.SIGNAL_RUNTIME_DEFAULT
    return pb.Signal.Value(f"SIGNAL_{name}")
