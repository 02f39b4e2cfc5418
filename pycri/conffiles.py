"""Files pycri reads but did not write, and that the operator chose (pycri's config,
registries.conf and its drop-ins, CNI conf dirs, CDI specs, NRI plugin configs, seccomp
profiles): one door (issue 41).

Each is opened without blocking (a FIFO cannot stall the event loop), must be a
regular file once opened (a directory, a device, `/dev/zero` behind a link are refused),
is read with a bound that holds while reading, and is decoded with a depth bound. Links
are followed: the paths are the operator's, and packages link configs. Every failure
is OSError (the file cannot be read as one) or ValueError naming what is wrong,
never the contents (a conf file may be a link to anything root reads).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pycri import boundedjson, parsefail

MAX_BYTES = 1 << 20  # a conflist, a registries.conf or pycri's config: a few KiB
MAX_DEPTH = 64


def reason(e: Exception) -> str:
    """What this door's failure says: the system's words for an OSError (never the path
    twice), the decoder's for a ValueError."""
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def read_bytes(path: Path | str, max_bytes: int = MAX_BYTES) -> bytes:
    return boundedjson.read_file(path, max_bytes, follow=True)


def read_text(path: Path | str, max_bytes: int = MAX_BYTES) -> str:
    try:
        return read_bytes(path, max_bytes).decode()
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None


def load_json(path: Path | str, max_bytes: int = MAX_BYTES) -> Any:
    data = read_bytes(path, max_bytes)
    try:
        return boundedjson.loads(data, max_bytes, MAX_DEPTH)
    except boundedjson.BoundsError as e:
        raise ValueError(str(e).removeprefix("is ")) from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(parsefail.invalid("JSON", e)) from None


def load_toml(path: Path | str, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    data = read_bytes(path, max_bytes)
    try:
        return tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(parsefail.invalid("TOML", e)) from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ValueError("TOML nested too deeply") from None
