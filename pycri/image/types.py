"""Value types the image package hands to the rest of pycri."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Image:
    id: str  # "sha256:<config digest>"
    repo_tags: list[str]
    repo_digests: list[str]
    size: int
    uid: int | None
    username: str
    pinned: bool
    config: dict[str, Any]
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass
class FsUsage:
    timestamp_ns: int
    mountpoint: str
    used_bytes: int
    inodes_used: int


def user_of(config: dict[str, Any]) -> tuple[int | None, str]:
    """(uid, username) from the config's USER: numeric gives a uid, a name a username."""
    user = str((config.get("config") or {}).get("User") or "")
    name = user.split(":", 1)[0]
    if not name:
        return None, ""
    if name.isdigit():
        return int(name), ""
    return None, name
