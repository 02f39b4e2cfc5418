"""A real Debian `docker-registry` on 127.0.0.1, plus small HTTP fronts for auth and stall tests.

    reg = Registry(tmp_path / "reg", htpasswd=("alice", "secret"))
    reg.start()      # free port, tmp storage, waits until /v2/ answers
    ...
    reg.stop()       # by pid

`BearerFront` puts the token flow (realm/service/scope) in front of a registry;
`StallFront` accepts connections and then goes silent (everything, or blobs
after half their bytes) to exercise pull-progress timeouts.
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
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                outer.requests.append(self.path)
                outer.handle(self)

            do_POST = do_GET

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

    def forward(self, h: http.server.BaseHTTPRequestHandler, cut: bool = False) -> None:
        """Relay one GET upstream; with `cut`, stop after half the body and go silent."""
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
