"""Data files shipped inside the package (`pycri/data/`), as real filesystem paths.

They are found through importlib.resources rather than relative to the source tree,
so a wheel installed into any site-packages works like a checkout. Callers get a
`Path` because their readers open files by path (seccomp's O_PATH + type check);
if pycri ever runs from a zip, `as_file` extracts a copy that lives until exit.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
from importlib import resources
from pathlib import Path

_extracted = contextlib.ExitStack()
atexit.register(_extracted.close)


@functools.cache
def data_path(name: str) -> Path:
    """The path of `pycri/data/<name>`; FileNotFoundError if the package lacks it."""
    ref = resources.files("pycri").joinpath("data", name)
    if not ref.is_file():
        raise FileNotFoundError(f"pycri package data {name!r} is missing (broken install?)")
    return _extracted.enter_context(resources.as_file(ref))
