"""`[metrics] listen`: `serve` answers `GET /metrics` and `GET /healthz` on HOST:PORT.

No web framework: prometheus_client's own WSGI app for `/metrics`, a small WSGI dispatcher
for `/healthz`, and the standard library's `wsgiref` server, one thread per request, in a
daemon thread beside the event loop (a scrape never waits for a pass, nor a pass for a
scrape). `/healthz` answers 200 when healthy, 503 when not, with a JSON body holding the
same `healthy` and `problems` as `status --format json` (and `generated_at`, `version`).
The server writes no access log (stderr carries JSON events only).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from lta_worker.errors import ConfigError, LtaError
from lta_worker.logs import get_logger

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

    from lta_worker.worker._metrics import Metrics

log = get_logger("lta_worker.metrics")
HealthFn = Callable[[], dict[str, Any]]


# At most this many connections are served at once; more are closed at once. Each one has
# `_QuietHandler.timeout` seconds per read: a client that trickles its request (slowloris)
# neither holds a thread for long nor piles threads and descriptors up.
MAX_CONNECTIONS = 32
# `/healthz` reads the database: one status at a time, reused this long, so that a flood
# of health checks costs the passes' database pool one status a second, not one a request.
HEALTH_FRESH_S = 1.0


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the limit: closed, nothing served
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = 10.0  # seconds for each read of the request: an idle client is let go

    def log_message(self, format: str, *args: Any) -> None:
        """No plain-text access log on stderr."""


def shared(health: HealthFn, fresh_for: float = HEALTH_FRESH_S) -> HealthFn:
    """`health` computed by one caller at a time, its result reused for `fresh_for` seconds
    (a failure is not kept: the next caller tries again)."""
    lock = threading.Lock()
    last: list[tuple[float, dict[str, Any]]] = []

    def once() -> dict[str, Any]:
        with lock:
            if last and time.monotonic() - last[0][0] < fresh_for:
                return last[0][1]
            data = health()
            last[:] = [(time.monotonic(), data)]
            return data

    return once


def health_app(health: HealthFn) -> Callable[[WSGIEnvironment, StartResponse], Iterable[bytes]]:
    """The `/healthz` WSGI app: 200 healthy / 503 unhealthy or unknown, a JSON body."""

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        try:
            data = health()
            body = {key: data[key] for key in ("healthy", "problems", "generated_at", "version")}
        except LtaError as exc:  # the database cannot be read: that is unhealthy too
            body = {"healthy": False, "problems": [f"status unavailable: {exc.message}"]}
        except Exception as exc:  # a bug: reported, never raised into wsgiref's plain log
            log.error("error", job="healthz", error=type(exc).__name__, message=str(exc))
            body = {"healthy": False, "problems": [f"status unavailable: {type(exc).__name__}"]}
        status = "200 OK" if body["healthy"] else "503 Service Unavailable"
        payload = json.dumps(body).encode()
        start_response(
            status,
            [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))],
        )
        return [payload]

    return app


def dispatcher(
    metrics: Metrics, health: HealthFn
) -> Callable[[WSGIEnvironment, StartResponse], Iterable[bytes]]:
    """`/metrics` to prometheus_client's app, `/healthz` to `health_app`, else 404."""
    metrics_app = make_wsgi_app(metrics.registry)
    healthz = health_app(health)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            answer: Iterable[bytes] = metrics_app(environ, start_response)
            return answer
        if path == "/healthz":
            return healthz(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics or /healthz\n"]

    return app


class MetricsServer:
    """The HTTP server of `[metrics] listen`, in a daemon thread; `close()` stops it."""

    def __init__(self, host: str, port: int, metrics: Metrics, health: HealthFn) -> None:
        server_class = _Server6 if ":" in host else _Server
        try:
            self.server = make_server(
                host,
                port,
                dispatcher(metrics, shared(health)),
                server_class=server_class,
                handler_class=_QuietHandler,
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port} ({exc.strerror or type(exc).__name__})",
                key="metrics.listen",
                hint="pick a free port, or an address of this host",
            ) from None
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="lta-worker-metrics", daemon=True
        )
        self.thread.start()
        log.info("metrics.listening", host=host, port=self.port)

    def close(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
