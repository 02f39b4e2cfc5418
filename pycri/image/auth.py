"""Registry credentials in every form a CRI AuthConfig can carry, and challenge parsing."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field

from pycri import errors


class Secret:
    """A credential: compares and hashes by its value (an Auth keys the token cache and
    shared pulls), and never prints it, whatever formats it (str, repr, a log line's
    %s, an f-string, an exception's text); `reveal` is the one way to the value, for
    the request header or form that carries it."""

    __slots__ = ("_value",)
    SHOWN = "<redacted>"

    def __init__(self, value: str = "") -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return self.SHOWN if self._value else "''"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Secret is not pickled")


@dataclass(frozen=True)
class Auth:
    """CRI `AuthConfig`: user+password, `auth` (base64 "user:password"), or tokens; the
    credentials are Secrets."""

    username: str = ""
    password: Secret = field(default_factory=Secret)
    auth: Secret = field(default_factory=Secret)
    server_address: str = ""
    identity_token: Secret = field(default_factory=Secret)
    registry_token: Secret = field(default_factory=Secret)

    def basic(self) -> tuple[str, str] | None:
        """The username/password pair, decoding `auth` when that is what was given."""
        if self.username or self.password:
            return self.username, self.password.reveal()
        if self.auth:
            try:
                raw = base64.b64decode(self.auth.reveal(), validate=True).decode()
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
