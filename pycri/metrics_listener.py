"""The /metrics listener (`metrics_address`): one thread running its own event loop.

Any local user can connect, so it is bounded like the streaming port (issue 22): at
most `max_connections` connections, `max_connections_per_peer` from one address (more
are answered 503 and closed at once), `header_timeout` seconds to send a request head
of at most MAX_HEAD bytes and `send_timeout` seconds to take the answer. One request
per connection (`Connection: close`), as prometheus_client's server did. The loop is
its own, not the daemon's: a flood of scrapes never delays a CRI call, and a scrape
still answers while the daemon's loop is busy. What a scrape reads is computed in this
thread (pycri.statemetrics.StateCollector reads the daemon's records without locks).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import threading
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from pycri.config import MetricsConfig
from pycri.streaming import http
from pycri.streaming.limits import RateLimitedLog

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

# A scrape's request head is a few hundred bytes; Prometheus sends under 1 KiB.
MAX_HEAD = 8 * 1024
PATHS = ("/metrics", "/")


class MetricsListener:
    """Serves `registry` on a listening socket from a thread; `stop` ends it."""

    def __init__(self, address: str, limits: MetricsConfig, registry: CollectorRegistry
                 ) -> None:  # fmt: skip
        host, _, port = address.rpartition(":")
        self.limits = limits  # read per connection: a reload's new bounds apply at once
        self.registry = registry
        self._sock = _bind(host.strip("[]"), int(port))
        self.port: int = self._sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._stopping = asyncio.Event()
        self._open = 0
        self._peers: Counter[str] = Counter()
        self._warn = RateLimitedLog(log)
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Close the listener and every connection; returns once the thread has ended."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join()
        else:
            self._sock.close()
            self._loop.close()

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        server = await asyncio.start_server(self._serve, sock=self._sock, limit=MAX_HEAD)
        async with server:
            await self._stopping.wait()
            server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _full(self, host: str) -> str | None:
        """Which bound a new connection from `host` is past, if any."""
        if self._open >= self.limits.max_connections:
            return f"{self.limits.max_connections} connections"
        if self._peers[host] >= self.limits.max_connections_per_peer:
            return f"{self.limits.max_connections_per_peer} connections from {host}"
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:  # fmt: skip
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else ""
        if (bound := self._full(host)) is not None:
            self._warn.warning("full", f"metrics listener at its bound of {bound}; "
                               "connections past it are closed")  # fmt: skip
            # A few bytes into an empty socket buffer: written and closed at once.
            writer.write(http.response(503, "Service Unavailable", {},
                                       b"too many metrics connections\n"))
            writer.close()
            return
        self._open += 1
        self._peers[host] += 1
        try:
            await self._answer(reader, writer)
        except (ConnectionError, TimeoutError):
            pass  # the client went away, or was silent or would not read: hang up
        except Exception:
            log.exception("metrics scrape failed")
        finally:
            self._open -= 1
            self._peers[host] -= 1
            if self._peers[host] <= 0:
                del self._peers[host]
            writer.transport.abort()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:  # fmt: skip
        try:
            request = await http.read_request(reader, self.limits.header_timeout)
        except http.BadRequest as e:
            await self._send(writer, http.response(400, "Bad Request", {}, f"{e}\n".encode()))
            return
        if request.method not in ("GET", "HEAD"):
            status, reason, headers, body = 405, "Method Not Allowed", {"Allow": "GET, HEAD"}, b""
        elif request.path not in PATHS:
            status, reason, headers, body = 404, "Not Found", {}, b"try /metrics\n"
        else:
            status, reason = 200, "OK"
            headers, body = self._exposition(request)
        data = http.response(status, reason, headers, body)
        if request.method == "HEAD":
            data = data[:len(data) - len(body)]
        await self._send(writer, data)

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        """Write `data` and close; a client that does not take it in `send_timeout`
        seconds is cut off (the abort in _serve)."""
        writer.write(data)
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), self.limits.send_timeout)

    def _exposition(self, request: http.Request) -> tuple[dict[str, str], bytes]:
        """The registry's text in the format the client accepts (OpenMetrics for
        Prometheus), gzipped when it accepts that."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(request.first("accept"))
        body = encoder(self.registry)
        headers = {"Content-Type": content_type}
        if "gzip" in (v.split(";")[0].strip() for v in request.values("accept-encoding")):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        return headers, body


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (its family from the address); OSError if not."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family = infos[0][0]
    return socket.create_server((host, port), family=family, backlog=128)


def serve(address: str, limits: MetricsConfig | None = None) -> Callable[[], None]:
    """Serve /metrics on `address` (host:port) within `limits` from its own thread
    (a MetricsListener); returns the stopper. OSError when it cannot be bound."""
    from pycri.metrics import REGISTRY

    listener = MetricsListener(address, limits or MetricsConfig(), REGISTRY.prometheus())
    listener.start()
    return listener.stop
