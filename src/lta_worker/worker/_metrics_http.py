"""`[metrics] listen`: `serve` answers `GET /metrics` and `GET /healthz` on HOST:PORT.

No web framework: prometheus_client's own WSGI app for `/metrics`, a small WSGI dispatcher
for `/healthz`, and the standard library's `wsgiref` server, one thread per request, in a
daemon thread beside the event loop (a scrape never waits for a pass, nor a pass for a
scrape). `/healthz` answers 200 when healthy, 503 when not, with a JSON body holding the
same `healthy` and `problems` as `status --format json` (and `generated_at`, `version`).
The server writes no access log (stderr carries JSON events only). Slow clients cannot
lock a scrape or a probe out: see `MAX_CONNECTIONS`, `HEAD_DEADLINE` and `Admission`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Final, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from lta_worker.errors import ConfigError, LtaError
from lta_worker.logs import get_logger
from lta_worker.worker._admission import Admission
from lta_worker.worker._listen import LISTEN_HINT

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

    from lta_worker.worker._metrics import Metrics
    from lta_worker.worker._runtime import Worker

log = get_logger("lta_worker.metrics")
# The `job` of an `error` event logged while this server answers (docs/log-events.md).
METRICS_JOB: Final = "metrics"
HEALTHZ_JOB: Final = "healthz"
SERVER_JOBS: Final = (METRICS_JOB, HEALTHZ_JOB)
HealthFn = Callable[[], dict[str, Any]]


# At most this many connections are open at once. Past it, a new connection closes the
# oldest one still sending its request head (a slow client, or an idle one) instead of being
# refused: slow clients cannot lock a scrape or a probe out, whose heads come in one packet.
# Only when every connection is being answered is the newcomer closed.
MAX_CONNECTIONS = 32
# Seconds a client has, from its connect, to send its whole request head; then it is closed.
# A limit per read would let a client that sends a header line now and then stay for good.
HEAD_DEADLINE = 10.0
# `/healthz` reads the database: one status at a time, reused this long, so that a flood
# of health checks costs the passes' database pool one status a second, not one a request.
HEALTH_FRESH_S = 1.0


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64  # the listen backlog: a burst of connects is not dropped
    admission: Admission
    admission_lock: threading.Lock

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.admission_lock:
            admitted, evicted = self.admission.admit(request, time.monotonic())
            for conn in evicted:
                _cut(conn)
        if not admitted:
            self.shutdown_request(request)  # every connection is being answered: closed
            return
        super().process_request(request, client_address)

    def head_done(self, request: Any) -> bool:
        """Called by the handler once `request`'s head is read: False when it was cut."""
        with self.admission_lock:
            return self.admission.head_done(request)

    def service_actions(self) -> None:
        """Between accepts (at least every half second): cut the heads past the deadline."""
        super().service_actions()
        with self.admission_lock:
            for conn in self.admission.expired(time.monotonic()):
                _cut(conn)

    def shutdown_request(self, request: Any) -> None:
        # Under the lock, so that a socket is never cut after its descriptor was closed
        # (and maybe reused by a new connection).
        with self.admission_lock:
            self.admission.release(request)
            super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone, timed out or cut is no error; anything else is one JSON event
        (never socketserver's plain traceback on stderr)."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            log.error("error", job=METRICS_JOB, error=type(exc).__name__, message=str(exc))


class _Server6(_Server):
    address_family = socket.AF_INET6


def _cut(conn: object) -> None:
    """End a connection from outside its thread: its blocked read returns at once and its
    own thread closes it."""
    with contextlib.suppress(OSError):
        cast("socket.socket", conn).shutdown(socket.SHUT_RDWR)


class _QuietHandler(WSGIRequestHandler):
    timeout = 10.0  # seconds for each read or write: bounds sending the answer too

    def parse_request(self) -> bool:
        """Parse the head, then answer only a connection that was not cut meanwhile."""
        return super().parse_request() and cast(_Server, self.server).head_done(self.request)

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
            log.error("error", job=HEALTHZ_JOB, error=type(exc).__name__, message=str(exc))
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

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Metrics,
        health: HealthFn,
        *,
        max_connections: int = MAX_CONNECTIONS,
        head_deadline: float = HEAD_DEADLINE,
    ) -> None:
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
                hint=LISTEN_HINT,
            ) from None
        self.server.admission = Admission(max_connections, head_deadline)
        self.server.admission_lock = threading.Lock()
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


def metrics_server(worker: Worker) -> MetricsServer | None:
    """`serve`'s `/metrics` and `/healthz` server when `metrics.listen` is set, else None."""
    listen = worker.settings.metrics.listen
    if not listen or worker.metrics is None:
        return None
    from lta_worker.config import parse_listen
    from lta_worker.report import collect_status

    host, port = parse_listen(listen)
    return MetricsServer(
        host,
        port,
        worker.metrics,
        lambda: collect_status(worker.settings, store=worker.store, problems=worker.problems()),
    )
