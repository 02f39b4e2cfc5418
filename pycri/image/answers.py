"""What a registry sends besides blobs, decoded at one door (issue 39): manifest and
index bodies, token answers, error bodies and redirects. Any pod can name any registry, so every
byte here is an attacker's.

Each body is read raw with a byte bound that holds while reading (never more than one
network read past it); JSON is decoded with a depth bound (`boundedjson`) into the few
typed values pycri uses; and every failure is a domain error naming the registry and
the reason, never the body. Time is bounded by the caller's pull-progress watchdog
(registry.py), which a whole document must beat.
"""

from __future__ import annotations

import re

import httpx

from pycri import boundedjson, errors

MAX_TOKEN_ANSWER = 1 << 20  # a token answer is a few KiB (a JWT, an expiry)
MAX_TOKEN = 64 << 10  # an Authorization header value pycri will send
MAX_ERROR_BODY = 64 << 10
MAX_DEPTH = 16
MAX_REDIRECTS = 5  # a blob behind a CDN takes one or two
MAX_LOCATION = 8 << 10
# A token goes into a header: visible ASCII only (no CR/LF to split the request).
_TOKEN = re.compile(r"[\x21-\x7e]+")
# Error codes of the distribution spec, the only part of an error body pycri repeats.
ERROR_CODES = frozenset({
    "BLOB_UNKNOWN", "BLOB_UPLOAD_INVALID", "BLOB_UPLOAD_UNKNOWN", "DIGEST_INVALID",
    "MANIFEST_BLOB_UNKNOWN", "MANIFEST_INVALID", "MANIFEST_UNKNOWN", "NAME_INVALID",
    "NAME_UNKNOWN", "SIZE_INVALID", "UNAUTHORIZED", "DENIED", "UNSUPPORTED",
    "TOOMANYREQUESTS",
})


class RegistryError(errors.PycriError):
    """The registry refused or failed a request; raised as one of the kinds below,
    each with its code."""


class AccessDenied(errors.PermissionDenied, RegistryError):
    """The registry refused the credentials, or the pull without them."""


class RegistryUnavailable(errors.Unavailable, RegistryError):
    """The registry (or its token service) failed, or answered what pycri cannot use;
    another try may succeed."""


class RegistryRefused(errors.FailedPrecondition, RegistryError):
    """The registry asks for what pycri does not do (an auth scheme, a request it
    answers 4xx), and a retry as it is will not help."""


async def read_body(resp: httpx.Response, limit: int, what: str) -> bytes:
    """The raw body, refused as soon as it passes `limit` (a Content-Length over it
    before any of it is read)."""
    check_length(resp, limit, what)
    data = bytearray()
    async for chunk in resp.aiter_raw():
        data += chunk
        if len(data) > limit:
            raise too_large(what, limit)
    return bytes(data)


def check_length(resp: httpx.Response, limit: int, what: str) -> None:
    """Refuse a body its Content-Length says is over `limit` before reading any of it."""
    length = resp.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(what, limit)


def too_large(what: str, limit: int) -> errors.InvalidArgument:
    return errors.InvalidArgument(f"{what}: larger than {limit} bytes")


async def check_redirect(resp: httpx.Response) -> None:
    """Each redirect a registry answers, before it is followed (httpx's response hook):
    to http or https only, with no userinfo (credentials of the registry's choosing),
    and a target of at most MAX_LOCATION bytes; httpx drops Authorization off-origin and
    stops after MAX_REDIRECTS."""
    if not resp.is_redirect:
        return
    location = resp.headers.get("location", "")
    what = f"{resp.request.url.host}: a redirect"
    if len(location) > MAX_LOCATION:
        raise RegistryRefused(f"{what} of {len(location)} bytes (limit {MAX_LOCATION})")
    try:
        target = resp.request.url.join(location)
    except (httpx.InvalidURL, ValueError):
        raise RegistryRefused(f"{what} to a URL that does not parse") from None
    if target.scheme not in ("http", "https") or target.userinfo:
        raise RegistryRefused(f"{what} to a URL pycri does not follow (scheme "
                              f"{target.scheme[:16]!r}, or userinfo in it)")


def token(body: bytes, where: str) -> str:
    """The bearer token of a token service's answer (`token`, else `access_token`)."""
    what = f"{where}: the token service's answer"
    try:
        doc = boundedjson.loads(body, MAX_TOKEN_ANSWER, MAX_DEPTH)
    except ValueError as e:  # json's, UnicodeDecodeError, BoundsError
        raise RegistryUnavailable(f"{what} is not JSON ({type(e).__name__})") from None
    if not isinstance(doc, dict):
        raise RegistryUnavailable(f"{what} is not a JSON object")
    value = doc.get("token") or doc.get("access_token")
    if not isinstance(value, str) or not value:
        raise RegistryUnavailable(f"{what} holds no token")
    if len(value) > MAX_TOKEN or not _TOKEN.fullmatch(value):
        raise RegistryUnavailable(f"{what} holds a token pycri cannot send (over {MAX_TOKEN} "
                                  "bytes, or not visible ASCII)")
    return value


def error_codes(body: bytes) -> list[str]:
    """The distribution spec's codes an error body names (`errors[].code`), as far as it
    can be read; never its free text."""
    try:
        doc = boundedjson.loads(body, MAX_ERROR_BODY, MAX_DEPTH)
    except ValueError:
        return []
    entries = doc.get("errors") if isinstance(doc, dict) else None
    codes = [e.get("code") for e in entries if isinstance(e, dict)] if isinstance(
        entries, list) else []
    return sorted({c for c in codes if isinstance(c, str) and c in ERROR_CODES})


def refusal(status: int, codes: list[str], what: str) -> RegistryError:
    """The error of a registry's non-200 answer (404 is the caller's NotFound)."""
    said = f" ({', '.join(codes)})" if codes else ""
    if status in (401, 403):
        return AccessDenied(f"{what}: access denied ({status}){said}")
    if status == 429 or status >= 500:
        return RegistryUnavailable(f"{what}: registry answered {status}{said}")
    return RegistryRefused(f"{what}: registry answered {status}{said}")
