"""A real Debian `docker-registry` on 127.0.0.1, plus small HTTP fronts for auth and stall tests.

    reg = Registry(tmp_path / "reg", htpasswd=("alice", "secret"))
    reg.start()      # free port, tmp storage, waits until /v2/ answers
    ...
    reg.stop()       # by pid

`BearerFront` puts the token flow (realm/service/scope) in front of a registry;
`StallFront` accepts connections and then goes silent (everything, or blobs
after half their bytes) to exercise pull-progress timeouts; `TrickleFront`
sends manifests (or blobs) one byte at a time and records when each trickle
ends; `HugeManifestFront` serves an oversized manifest only as fast as the
client reads it, so what it sent is what the client took.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt

REGISTRY_BIN = "/usr/bin/docker-registry"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_http(addr: str, timeout: float = 15.0) -> None:
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            c = http.client.HTTPConnection(host, int(port), timeout=1)
            c.request("GET", "/v2/")
            c.getresponse().read()
            c.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Registry:
    def __init__(self, workdir: Path, htpasswd: tuple[str, str] | None = None) -> None:
        self.workdir = workdir
        self.data = workdir / "data"
        self.log_path = workdir / "registry.log"
        self.htpasswd = htpasswd
        self.addr = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Registry:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(exist_ok=True)
        self.addr = f"127.0.0.1:{free_port()}"
        auth = ""
        if self.htpasswd:
            user, pw = self.htpasswd
            hashed = bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=4)).decode()
            (self.workdir / "htpasswd").write_text(f"{user}:{hashed}\n")
            auth = (f"auth:\n  htpasswd:\n    realm: pycri-test\n"
                    f"    path: {self.workdir / 'htpasswd'}\n")
        cfg = self.workdir / "config.yml"
        cfg.write_text(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.data}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.addr}\n{auth}"
        )
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [REGISTRY_BIN, "serve", str(cfg)], stdout=log, stderr=log,
                start_new_session=True,
            )
        try:
            _wait_http(self.addr)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def blob_path(self, digest: str) -> Path:
        hexd = digest.split(":", 1)[1]
        return self.data / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    def blob_gets(self, digest: str) -> int:
        """How many times a blob was fetched (GET, from the access log)."""
        pat = re.compile(rf'"GET /v2/[^ ]*/blobs/{re.escape(digest)} ')
        return len(pat.findall(self.log_path.read_text(errors="replace")))


class _Front(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _FrontBase:
    """A threaded HTTP server on a free loopback port forwarding GETs to `upstream`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.stopping = threading.Event()
        self.requests: list[str] = []
        self.forms: list[bytes] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                outer.requests.append(self.path)
                outer.handle(self)

            def do_POST(self) -> None:  # the form is read, so the next request parses
                outer.forms.append(self.rfile.read(int(self.headers.get("Content-Length",
                                                                        0))))
                self.do_GET()

        self.server = _Front(("127.0.0.1", 0), Handler)
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> _FrontBase:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        raise NotImplementedError

    def fetch(self, h: http.server.BaseHTTPRequestHandler) -> bytes:
        """GET what `h` asks for upstream and send its status and headers; returns its body
        (the caller sends it: whole, in part, or slowly)."""
        host, port = self.upstream.rsplit(":", 1)
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        headers = {k: v for k, v in h.headers.items() if k.lower() in ("accept", "range")}
        c.request("GET", h.path, headers=headers)
        r = c.getresponse()
        body = r.read()
        c.close()
        h.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        return body

    def forward(self, h: http.server.BaseHTTPRequestHandler, cut: bool = False) -> None:
        """Relay one GET upstream; with `cut`, stop after half the body and go silent."""
        body = self.fetch(h)
        if cut:
            h.wfile.write(body[: len(body) // 2])
            h.wfile.flush()
            self.stopping.wait(60)
            return
        h.wfile.write(body)

    def challenge(self, h: http.server.BaseHTTPRequestHandler, value: str) -> None:
        h.send_response(401)
        h.send_header("WWW-Authenticate", value)
        h.send_header("Content-Length", "0")
        h.end_headers()


class BearerFront(_FrontBase):
    """Registry token flow: /v2/ answers 401 with a Bearer challenge; /token issues
    a token per repository scope to `user:password` (or anonymously if creds is None)."""

    def __init__(self, upstream: str, creds: tuple[str, str] | None) -> None:
        super().__init__(upstream)
        self.creds = creds
        self.token_requests: list[str] = []

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/token"):
            self._token(h)
            return
        m = re.match(r"^/v2/(.+)/(manifests|blobs)/", h.path)
        scope = f"repository:{m.group(1)}:pull" if m else "registry:catalog:*"
        want = "Bearer tok." + base64.urlsafe_b64encode(scope.encode()).decode()
        if h.headers.get("Authorization") != want:
            self.challenge(h, f'Bearer realm="http://{self.addr}/token",'
                              f'service="pycri-test",scope="{scope}"')
            return
        self.forward(h)

    def _token(self, h: http.server.BaseHTTPRequestHandler) -> None:
        self.token_requests.append(h.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(h.path.partition("?")[2]).items()}
        scope = q.get("scope", "")
        if self.creds is not None:
            expect = "Basic " + base64.b64encode(":".join(self.creds).encode()).decode()
            if h.headers.get("Authorization") != expect or q.get("service") != "pycri-test":
                h.send_response(401)
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
        token = "tok." + base64.urlsafe_b64encode(scope.encode()).decode()
        body = json.dumps({"token": token}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)


class AnswerFront(BearerFront):
    """A hostile token service, or registry: /token answers `body` (`size` bytes of it
    repeated, chunked unless `length`); with `status`, the registry's own answers are
    that status with `body` instead. `sent` counts the body bytes the socket took."""

    def __init__(self, upstream: str, body: bytes, size: int = 0, length: bool = True,
                 status: int = 0) -> None:
        super().__init__(upstream, None)
        self.body, self.size, self.length, self.status = body, size or len(body), length, status
        self.sent = 0

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        if self.status and not h.path.startswith("/token"):
            self._answer(h, self.status)
            return
        super().handle(h)

    def _token(self, h: http.server.BaseHTTPRequestHandler) -> None:
        self.token_requests.append(h.path)
        self._answer(h, 200)

    def _answer(self, h: http.server.BaseHTTPRequestHandler, status: int) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        if self.length:
            h.send_header("Content-Length", str(self.size))
        else:
            h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        try:
            left = self.size
            while left > 0:
                piece = (self.body * (1 + (64 << 10) // len(self.body)))[: min(left, 64 << 10)]
                h.wfile.write(piece if self.length else b"%x\r\n%s\r\n" % (len(piece), piece))
                h.wfile.flush()
                self.sent += len(piece)
                left -= len(piece)
            if not self.length:
                h.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client stopped reading: what a bound is for
            h.close_connection = True


class RedirectFront(_FrontBase):
    """Blobs sent elsewhere, as a registry backed by object storage does: a blob GET is
    redirected to a presigned URL carrying `secret` in its query, served here too."""

    def __init__(self, upstream: str, secret: str, location: str = "") -> None:
        """`location`: where every manifest request is sent instead (a hostile redirect;
        "{self}" is this front's address)."""
        super().__init__(upstream)
        self.secret = secret
        self.location = location

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/cdn/"):
            h.path = h.path[len("/cdn"):].partition("?")[0]
            self.forward(h)
            return
        if self.location and "/manifests/" in h.path:
            h.send_response(302)
            h.send_header("Location", self.location.replace("{self}", self.addr))
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if "/blobs/" in h.path:
            h.send_response(307)
            h.send_header("Location", f"http://{self.addr}/cdn{h.path}?X-Amz-Signature="
                                      f"{self.secret}")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        self.forward(h)


class StallFront(_FrontBase):
    """mode "all": never answers; mode "blob": manifests pass, blobs stop half-way."""

    def __init__(self, upstream: str, mode: str) -> None:
        super().__init__(upstream)
        self.mode = mode

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        if self.mode == "all" or (self.mode == "blob-silent" and "/blobs/" in h.path):
            self.stopping.wait(60)
            return
        self.forward(h, cut="/blobs/" in h.path and self.mode == "blob")


class HoldFront(_FrontBase):
    """Blob bodies of more than `over` bytes stop after their first half until `release`
    is set (or the front stops); with `corrupt`, every blob body has one byte flipped."""

    def __init__(self, upstream: str, over: int = 0, corrupt: bool = False) -> None:
        super().__init__(upstream)
        self.over, self.corrupt = over, corrupt
        self.release = threading.Event()
        self.holding = threading.Event()  # set once a first half has been sent

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        if "/blobs/" not in h.path:
            self.forward(h)
            return
        body = bytearray(self.fetch(h))
        if self.corrupt and body:
            body[len(body) // 2] ^= 0xFF
        if len(body) <= self.over:
            h.wfile.write(body)
            return
        try:
            h.wfile.write(body[: len(body) // 2])
            h.wfile.flush()
            self.holding.set()
            while not self.release.wait(0.05):
                if self.stopping.is_set():
                    return
            h.wfile.write(body[len(body) // 2 :])
        except OSError:
            pass
        h.close_connection = True


class PaceFront(_FrontBase):
    """Blob bodies go `chunk` bytes every `delay` seconds; everything else at once."""

    def __init__(self, upstream: str, chunk: int, delay: float) -> None:
        super().__init__(upstream)
        self.chunk, self.delay = chunk, delay

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        if "/blobs/" not in h.path:
            self.forward(h)
            return
        body = self.fetch(h)
        try:
            for i in range(0, len(body), self.chunk):
                if self.stopping.wait(self.delay):
                    return
                h.wfile.write(body[i : i + self.chunk])
                h.wfile.flush()
        except OSError:
            pass
        h.close_connection = True


@dataclass
class Trickle:
    """One body sent byte by byte: when it ended (None: still going) and how."""

    started: float
    ended: float | None = None
    completed: bool = False  # every byte sent (else the client went away, or we stopped)


class TrickleFront(_FrontBase):
    """Bodies of `what` ("/manifests/" or "/blobs/") go one byte every `delay` seconds;
    everything else passes at full speed. A client that closes is seen within two bytes
    (the first write after its close draws a reset, the second fails)."""

    def __init__(self, upstream: str, delay: float, what: str = "/manifests/") -> None:
        super().__init__(upstream)
        self.delay, self.what = delay, what
        self.trickles: list[Trickle] = []

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        if self.what not in h.path:
            self.forward(h)
            return
        body = self.fetch(h)
        t = Trickle(time.monotonic())
        self.trickles.append(t)
        try:
            for i in range(len(body)):
                if self.stopping.wait(self.delay):
                    return
                h.wfile.write(body[i : i + 1])
            t.completed = True
        except OSError:
            pass
        finally:
            t.ended = time.monotonic()
        h.close_connection = True

    def wait_ended(self, timeout: float) -> bool:
        """True once every trickle started so far has ended (within `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while any(t.ended is None for t in self.trickles):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True


def _tcp_queues(local: tuple[str, int], remote: tuple[str, int]) -> tuple[int, int] | None:
    """(send queue, receive queue) of the established loopback TCP socket local->remote,
    from /proc/net/tcp; None when it is gone or closing."""
    def addr(a: tuple[str, int]) -> str:
        return f"{socket.inet_aton(a[0])[::-1].hex().upper()}:{a[1]:04X}"

    want = (addr(local), addr(remote))
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if (fields[1], fields[2]) == want:
                if fields[3] != "01":  # TCP_ESTABLISHED
                    return None
                tx, rx = fields[4].split(":")
                return int(tx, 16), int(rx, 16)
    return None


class HugeManifestFront(_FrontBase):
    """Every manifest is `size` bytes, announced by a Content-Length ("length"), by one
    that says 1000 ("short"), or by none (chunked). Each 64 KiB piece goes only once the
    client has read all that came before (nothing in flight or in its receive queue),
    so `sent` bounds what the client read from above by one piece: socket buffers,
    megabytes on loopback, do not count."""

    PIECE = 64 << 10

    def __init__(self, upstream: str, size: int, framing: str) -> None:
        super().__init__(upstream)
        self.size, self.framing = size, framing
        self.sent = 0  # body bytes written

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        if "/manifests/" not in h.path:
            self.forward(h)
            return
        h.close_connection = True
        h.send_response(200)
        h.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        if self.framing == "chunked":
            h.send_header("Transfer-Encoding", "chunked")
        else:
            h.send_header("Content-Length", str(self.size if self.framing == "length" else 1000))
        h.end_headers()
        body = b'{"schemaVersion": 2, "annotations": {"a": "' + b"x" * self.size
        try:
            while self._read_all(h) and self.sent < self.size:
                piece = body[self.sent : self.sent + self.PIECE]
                if self.framing == "chunked":
                    piece = b"%x\r\n%s\r\n" % (len(piece), piece)
                h.wfile.write(piece)
                self.sent += min(self.PIECE, self.size - self.sent)
            if self.framing == "chunked" and self.sent == self.size:
                h.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass

    def _read_all(self, h: http.server.BaseHTTPRequestHandler) -> bool:
        """Wait until the client has read everything sent; False once it is gone."""
        me, peer = h.connection.getsockname(), h.connection.getpeername()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not self.stopping.is_set():
            ours, theirs = _tcp_queues(me, peer), _tcp_queues(peer, me)
            if ours is None or theirs is None:
                return False
            if ours[0] == 0 and theirs[1] == 0:
                return True
            time.sleep(0.001)
        return False
