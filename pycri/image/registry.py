"""Pull side of the OCI distribution API on httpx.

Each request goes to the endpoints registries.conf gives (mirrors first),
over https (system CA or the configured one), or plain http when the endpoint
is insecure or on loopback and https does not answer. Authentication follows
the registry's challenge: Basic, or a bearer token fetched from the realm and
cached per repository. Every network wait is bounded by the pull-progress
timeout, which restarts only on progress: a whole manifest, or a response's
headers and then each CHUNK of a blob. So a stalled registry fails the pull
instead of hanging the kubelet, and one trickling a byte at a time does too.
Bodies are read raw (never decompressed) and counted: a manifest stops at
MAX_MANIFEST bytes, a blob at its descriptor's size.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx

from pycri import errors, metrics
from pycri.config import ImagesConfig
from pycri.image import answers
from pycri.image.answers import AccessDenied, RegistryRefused
from pycri.image.auth import Auth, parse_challenge
from pycri.image.content import BlobWriter, DigestMismatch
from pycri.image.regconf import Endpoint, is_loopback
from pycri.logs import without_url_secrets
from pycri.together import in_thread

log = logging.getLogger("pycri.image.registry")

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = (OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST)
MAX_MANIFEST = 4 << 20
# Cached Authorization values (per registry, repository and credentials), oldest dropped.
MAX_TOKENS = 256
# Blobs are read and written in pieces of this size; each one is progress.
CHUNK = 1 << 20


class ManifestNotFound(errors.NotFound):
    """The registry has no such tag or digest."""


class Stalled(errors.DeadlineExceeded):
    """No byte arrived within the pull-progress timeout."""


class _Watchdog:
    """A deadline that moves forward on progress; a `whole` fetch (a manifest: 4 MiB at
    most) gets none before its end, so trickling it buys nothing."""

    def __init__(self, seconds: float, whole: bool) -> None:
        self.seconds, self._whole = seconds, whole
        self._cm = asyncio.timeout(seconds)

    def progress(self) -> None:
        if not self._whole:
            self._cm.reschedule(asyncio.get_running_loop().time() + self.seconds)

    def pause(self) -> None:
        """No deadline until the next `progress`: the wait is ours (an unpack behind on
        the disk), not the registry's."""
        if not self._whole:
            self._cm.reschedule(None)


@asynccontextmanager
async def _watch(seconds: float, what: str, whole: bool = False) -> AsyncIterator[_Watchdog]:
    dog = _Watchdog(seconds, whole)
    try:
        async with dog._cm:
            yield dog
    except TimeoutError:
        metrics.PULL_STALLS.inc()
        raise Stalled(f"{what}: no progress for {seconds:g}s (pull_progress_timeout)") from None


class RegistryClient:
    """One per ImageManager: connection pools, scheme and token caches."""

    def __init__(self, cfg: ImagesConfig) -> None:
        self._cfg = cfg
        timeout = httpx.Timeout(
            connect=cfg.connect_timeout, read=cfg.read_timeout,
            write=cfg.read_timeout, pool=cfg.pull_progress_timeout,
        )
        verify: ssl.SSLContext | bool = True
        if cfg.ca_file:
            verify = ssl.create_default_context(cafile=cfg.ca_file)
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=16)
        hooks = {"response": [answers.check_redirect]}
        self._secure = httpx.AsyncClient(
            verify=verify, timeout=timeout, follow_redirects=True, limits=limits,
            max_redirects=answers.MAX_REDIRECTS, event_hooks=hooks,
        )
        self._insecure = httpx.AsyncClient(
            verify=False, timeout=timeout, follow_redirects=True, limits=limits,
            max_redirects=answers.MAX_REDIRECTS, event_hooks=hooks,
        )
        self._scheme: dict[str, str] = {}
        self._tokens: dict[tuple[str, str, Auth | None], str] = {}

    async def aclose(self) -> None:
        await self._secure.aclose()
        await self._insecure.aclose()

    def _schemes(self, ep: Endpoint) -> list[str]:
        known = self._scheme.get(ep.api_host)
        if known:
            return [known]
        if ep.insecure or is_loopback(ep.api_host):
            return ["https", "http"]
        return ["https"]

    @asynccontextmanager
    async def _get(
        self, ep: Endpoint, path: str, auth: Auth | None, accept: str | None, dog: _Watchdog
    ) -> AsyncIterator[httpx.Response]:
        """GET /v2/<repo>/<path> with scheme fallback and one auth round trip."""
        client = self._insecure if ep.insecure else self._secure
        schemes = self._schemes(ep)
        auth = auth if auth is not None and auth.applies_to(ep.host) else None
        last: Exception | None = None
        for scheme in schemes:
            url = f"{scheme}://{ep.api_host}/v2/{ep.repository}/{path}"
            # Bodies are hashed as sent; a decoder could also turn 64 KiB into gigabytes.
            headers = {"Accept-Encoding": "identity", **({"Accept": accept} if accept else {})}
            try:
                resp = await self._send(client, url, headers, ep, auth, dog)
            except (httpx.ConnectError, httpx.RemoteProtocolError) as e:
                last = e
                continue
            except Exception as e:
                if _bad_address(e):
                    raise errors.InvalidArgument(
                        f"registry address {ep.api_host!r} is not usable: {_said(_leaf(e))}"
                    ) from None
                raise
            self._scheme[ep.api_host] = scheme
            try:
                yield resp
            finally:
                await resp.aclose()
            return
        raise errors.Unavailable(f"cannot reach registry {ep.api_host}: {_said(last)}") from None

    async def _send(
        self, client: httpx.AsyncClient, url: str, headers: dict[str, str],
        ep: Endpoint, auth: Auth | None, dog: _Watchdog,
    ) -> httpx.Response:
        key = (ep.api_host, ep.repository, auth)  # never reuse one caller's credentials for another
        if key in self._tokens:
            headers = {**headers, "Authorization": self._tokens[key]}
        resp = await client.send(client.build_request("GET", url, headers=headers), stream=True)
        dog.progress()
        if resp.status_code != 401:
            return resp
        challenge = resp.headers.get("www-authenticate", "")
        try:
            if not challenge:  # a refusal that asks for nothing
                await _check_status(resp, f"{ep.api_host}/{ep.repository}")
        finally:
            await resp.aclose()
        value = await self._authorize(client, challenge, ep, auth, dog)
        self._tokens[key] = value
        while len(self._tokens) > MAX_TOKENS:  # rotating credentials must not pile up
            del self._tokens[next(iter(self._tokens))]
        headers = {**headers, "Authorization": value}
        resp = await client.send(client.build_request("GET", url, headers=headers), stream=True)
        dog.progress()
        if resp.status_code == 401:
            await resp.aclose()
            self._tokens.pop(key, None)
            raise AccessDenied(f"{ep.api_host}/{ep.repository}: credentials refused")
        return resp

    async def _authorize(
        self, client: httpx.AsyncClient, challenge: str, ep: Endpoint,
        auth: Auth | None, dog: _Watchdog,
    ) -> str:
        """Answer a 401 challenge with an Authorization header value."""
        scheme, params = parse_challenge(challenge)
        where = f"{ep.api_host}/{ep.repository}"
        creds = auth.basic() if auth else None
        if scheme == "basic":
            if creds is None:
                raise AccessDenied(f"{where}: unauthorized (registry wants credentials)")
            return _basic_header(*creds)
        if scheme != "bearer" or "realm" not in params:
            raise RegistryRefused(f"{where}: unsupported auth challenge "
                                  f"({scheme[:32]!r} without a realm, or not basic or bearer)")
        if auth and auth.registry_token:
            return f"Bearer {auth.registry_token.reveal()}"
        query = {"scope": f"repository:{ep.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        what = f"{where}: token service"
        try:
            if auth and auth.identity_token:
                form = {**query, "grant_type": "refresh_token", "client_id": "pycri",
                        "refresh_token": auth.identity_token.reveal()}
                request = client.build_request("POST", params["realm"], data=form)
            else:
                basic = {"Authorization": _basic_header(*creds)} if creds else {}
                request = client.build_request("GET", params["realm"], params=query,
                                               headers=basic)
            resp = await client.send(request, stream=True)
            try:
                dog.progress()
                await _check_status(resp, what)
                body = await answers.read_body(resp, answers.MAX_TOKEN_ANSWER, what)
            finally:
                await resp.aclose()
        except httpx.HTTPError as e:
            raise errors.Unavailable(f"{what} {_said(params['realm'])}: {_said(e)}") from None
        return f"Bearer {answers.token(body, where)}"

    async def manifest(
        self, ep: Endpoint, obj: str, auth: Auth | None, expected: str | None = None
    ) -> tuple[bytes, str, str]:
        """Fetch a manifest or index: (bytes, media type, digest), digest-verified. It must
        arrive whole within the pull-progress timeout and hold at most MAX_MANIFEST bytes:
        a Content-Length over that is refused unread, and a body is read only until it
        passes the limit (one network read more at most), whatever its headers said."""
        what = f"manifest {ep.api_host}/{ep.repository}:{obj}"
        try:
            async with (
                _watch(self._cfg.pull_progress_timeout, what, whole=True) as dog,
                self._get(ep, f"manifests/{obj}", auth, ", ".join(MANIFEST_TYPES), dog) as resp,
            ):
                if resp.status_code == 404:
                    raise ManifestNotFound(f"{what}: not found")
                await _check_status(resp, what)
                data = await answers.read_body(resp, MAX_MANIFEST, what)
                ctype = resp.headers.get("content-type", "").split(";")[0].strip()
        except httpx.TimeoutException as e:
            raise errors.Unavailable(f"{what}: timed out ({type(e).__name__})") from None
        except httpx.HTTPError as e:
            raise errors.Unavailable(f"{what}: {_said(e)}") from None
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if expected and digest != expected:
            raise DigestMismatch(f"{what}: content hashes to {digest}")
        return bytes(data), ctype, digest

    async def blob(self, ep: Endpoint, auth: Auth | None, w: BlobWriter,
                   then: Callable[[bytes], Awaitable[object]] | None = None) -> None:
        """Stream a blob into `w` (which verifies size and digest as it goes, so a body
        stops one CHUNK past the descriptor's size at most; a Content-Length past it is
        refused unread), and each chunk, once `w` has it, to `then` (a layer's unpack)."""
        what = f"blob {ep.api_host}/{ep.repository}@{w.digest}"
        try:
            async with (
                _watch(self._cfg.pull_progress_timeout, what) as dog,
                self._get(ep, f"blobs/{w.digest}", auth, None, dog) as resp,
            ):
                if resp.status_code == 404:
                    raise errors.NotFound(f"{what}: not found")
                await _check_status(resp, what)
                if w.size is not None:
                    answers.check_length(resp, w.size, what)
                async for chunk in resp.aiter_raw(CHUNK):
                    dog.progress()
                    metrics.PULL_BYTES.inc(len(chunk))
                    # Hashing and writing 1 MiB releases the GIL: do it off the event loop
                    # (and, cancelled, let the write end before the caller's abort).
                    await in_thread(w.write, chunk)
                    if then is not None:
                        dog.pause()
                        await then(chunk)
                        dog.progress()
        except httpx.TimeoutException as e:
            raise errors.Unavailable(f"{what}: timed out ({type(e).__name__})") from None
        except httpx.HTTPError as e:
            raise errors.Unavailable(f"{what}: {_said(e)}") from None


_BAD_ADDRESS = (httpx.InvalidURL, OverflowError)


def _bad_address(e: BaseException) -> bool:
    """An address no connection can be made to (a port over 65535 makes connect() raise
    OverflowError), bare or inside the ExceptionGroup of anyio's connect task group."""
    if isinstance(e, BaseExceptionGroup):
        other = e.subgroup(
            lambda x: not isinstance(x, BaseExceptionGroup) and not isinstance(x, _BAD_ADDRESS)
        )
        return other is None
    return isinstance(e, _BAD_ADDRESS)


def _said(e: object) -> str:
    """An error's (or a URL's) text for a message: its URLs without userinfo or query."""
    return without_url_secrets(str(e))


def _leaf(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    return e


def _basic_header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def _check_status(resp: httpx.Response, what: str) -> None:
    """A non-200 answer as its domain error, with the spec's error codes its body names
    (read bounded; a body that cannot be read names none)."""
    if resp.status_code == 200:
        return
    body = b""
    with contextlib.suppress(httpx.HTTPError, errors.PycriError):
        body = await answers.read_body(resp, answers.MAX_ERROR_BODY, what)
    raise answers.refusal(resp.status_code, answers.error_codes(body), what)
