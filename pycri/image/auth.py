"""Registry credentials in every form a CRI AuthConfig can carry, and challenge parsing."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

from pycri import errors


@dataclass(frozen=True)
class Auth:
    """CRI `AuthConfig`: user+password, `auth` (base64 "user:password"), or tokens."""

    username: str = ""
    password: str = ""
    auth: str = ""
    server_address: str = ""
    identity_token: str = ""
    registry_token: str = ""

    def basic(self) -> tuple[str, str] | None:
        """The username/password pair, decoding `auth` when that is what was given."""
        if self.username or self.password:
            return self.username, self.password
        if self.auth:
            try:
                raw = base64.b64decode(self.auth, validate=True).decode()
            except ValueError:  # not base64, not ASCII (b64decode's own ValueError), not UTF-8
                raise errors.InvalidArgument("auth: not base64 of 'user:password'") from None
            user, sep, password = raw.partition(":")
            if not sep:
                raise errors.InvalidArgument("auth: decoded value has no ':' separator")
            return user, password
        return None

    def applies_to(self, host: str) -> bool:
        """Credentials go only to the registry they were given for, never to a mirror."""
        if not self.server_address:
            return True
        addr = re.sub(r"^https?://", "", self.server_address).split("/", 1)[0]
        aliases = {"docker.io", "index.docker.io", "registry-1.docker.io"}
        return addr == host or (addr in aliases and host in aliases)


_PARAM = re.compile(r'(\w+)=(?:"([^"]*)"|([^,\s]*))')


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="...",service="..."` -> ("bearer", {...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
              for m in _PARAM.finditer(rest)}
    return scheme.lower(), params
