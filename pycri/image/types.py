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


# Linux uids are 32-bit; (uid_t)-1 means "unchanged" and is never a real id.
MAX_ID = 2**32 - 2


def user_of(config: dict[str, Any]) -> tuple[int | None, str]:
    """(uid, username) from the config's USER: numeric gives a uid, a name a username.

    Pulls refuse a bad USER; this still reads any stored value without raising."""
    inner = config.get("config")
    user = inner.get("User") if isinstance(inner, dict) else None
    name = user.split(":", 1)[0] if isinstance(user, str) else ""
    if not name:
        return None, ""
    if name.isdigit():
        return (int(name), "") if int(name) <= MAX_ID else (None, "")
    return None, name
