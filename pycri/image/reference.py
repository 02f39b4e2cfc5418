"""Image reference parsing and the docker.io normalisation the kubelet expects.

`busybox` means `docker.io/library/busybox:latest`; every stored tag and
digest reference is kept in this fully qualified form so lookups by any
spelling of a name meet the same record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pycri import errors

DOCKER_HUB = "docker.io"
DOCKER_HUB_ENDPOINT = "registry-1.docker.io"

_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
_DOMAIN = re.compile(r"^(?:[a-zA-Z0-9.-]+|\[[0-9a-fA-F:]+\])(?::[0-9]+)?$")


@dataclass(frozen=True)
class Reference:
    """A parsed, normalised reference; `digest` wins over `tag` when both are given."""

    domain: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def repository(self) -> str:
        """`domain/path`, the name under which tags and digests are recorded."""
        return f"{self.domain}/{self.path}"

    @property
    def object(self) -> str:
        """What to ask the registry for: the digest if known, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        if self.digest:
            return f"{self.repository}@{self.digest}"
        return f"{self.repository}:{self.tag or 'latest'}"


def _split_domain(name: str) -> tuple[str, str]:
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        domain, path = first, rest
    else:
        domain, path = DOCKER_HUB, name
    if domain == "index.docker.io":
        domain = DOCKER_HUB
    if domain == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    return domain, path


def parse(ref: str) -> Reference:
    """Parse and normalise `ref`; raise InvalidArgument with the reason if it is malformed."""
    if not ref or len(ref) > 4096 or ref != ref.strip():
        raise errors.InvalidArgument(f"invalid image reference {ref!r}")
    name, at, digest = ref.partition("@")
    if at and not _DIGEST.match(digest):
        raise errors.InvalidArgument(f"invalid image reference {ref!r}: bad digest {digest!r}")
    tag: str | None = None
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
        if not _TAG.match(tag):
            raise errors.InvalidArgument(f"invalid image reference {ref!r}: bad tag {tag!r}")
    domain, path = _split_domain(name)
    if not _DOMAIN.match(domain):
        raise errors.InvalidArgument(f"invalid image reference {ref!r}: bad registry {domain!r}")
    if ":" in domain and not domain.endswith("]"):
        port = domain.rpartition(":")[2]
        if not port or not 0 < int(port) <= 65535:
            raise errors.InvalidArgument(
                f"invalid image reference {ref!r}: registry port {port!r} is not in 1-65535"
            )
    if not path or not all(_COMPONENT.match(c) for c in path.split("/")):
        raise errors.InvalidArgument(
            f"invalid image reference {ref!r}: repository must be lowercase "
            "components of [a-z0-9._-] separated by '/'"
        )
    if not at and tag is None:
        tag = "latest"
    return Reference(domain, path, tag, digest or None)


def is_digest(value: str) -> bool:
    return bool(_DIGEST.match(value))
