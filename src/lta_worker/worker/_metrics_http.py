"""`[metrics] listen`: `GET /metrics` and `GET /healthz` (docs/operations.md, *Metrics and
health*) through `wsgiref` in a daemon thread, no web framework, no access log.
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

from lta_worker.errors import ConfigError, LtaError, StorageError
from lta_worker.logs import get_logger
from lta_worker.worker._listen import LISTEN_HINT, Admission

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


# Connections kept at most, and the seconds each has to send its whole head (`Admission`).
MAX_CONNECTIONS = 32
HEAD_DEADLINE = 10.0
# `/healthz` reads the database (`SharedHealth`): a flood of probes costs one status a
# second; a probe waits at most HEALTH_WAIT_S (then 503), and past MAX_HEALTH_WAITING
# waiting probes the others are answered at once, so a scrape always gets in.
HEALTH_FRESH_S = 1.0
HEALTH_WAIT_S = 5.0
MAX_HEALTH_WAITING = MAX_CONNECTIONS // 2


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
        """A client gone, timed out or cut is no error; anything else is one JSON event."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            log.error("error", job=METRICS_JOB, error=type(exc).__name__, message=str(exc))


class _Server6(_Server):
    address_family = socket.AF_INET6


def _cut(conn: object) -> None:
    """End a connection from outside its thread (its own thread then closes it)."""
    with contextlib.suppress(OSError):
        cast("socket.socket", conn).shutdown(socket.SHUT_RDWR)


class _QuietHandler(WSGIRequestHandler):
    timeout = 10.0  # seconds for each read or write: bounds sending the answer too

    def parse_request(self) -> bool:
        """Parse the head, then answer only a connection that was not cut meanwhile."""
        return super().parse_request() and cast(_Server, self.server).head_done(self.request)

    def log_message(self, format: str, *args: Any) -> None:
        """No plain-text access log on stderr."""


class SharedHealth:
    """`health` computed in a thread of its own, one at a time, shared by every caller, a
    success reused for `fresh_for` s; a caller waits at most `wait_s` from its start, and
    past `max_waiting` callers not at all (a hung database cannot hold the probes).
    """

    def __init__(
        self,
        health: HealthFn,
        fresh_for: float = HEALTH_FRESH_S,
        wait_s: float = HEALTH_WAIT_S,
        max_waiting: int = MAX_HEALTH_WAITING,
    ) -> None:
        self.health, self.fresh_for, self.wait_s = health, fresh_for, wait_s
        self.max_waiting = max_waiting
        self.done = threading.Condition()
        self.fresh: tuple[float, dict[str, Any]] | None = None  # (when computed, the data)
        self.started: float | None = None  # the computation in flight, since
        self.runs = 0  # computations started
        self.finished: tuple[int, dict[str, Any] | BaseException] = (0, {})  # (run, outcome)
        self.waiting = 0

    def _compute(self, run: int) -> None:
        outcome: dict[str, Any] | BaseException
        try:
            outcome = self.health()
        except BaseException as exc:  # handed to the callers waiting for this run
            outcome = exc
        with self.done:
            started, self.started = self.started, None
            self.finished = (run, outcome)
            if not isinstance(outcome, BaseException) and started is not None:
                self.fresh = (started, outcome)  # as old as the state it read
            self.done.notify_all()

    def __call__(self) -> dict[str, Any]:
        with self.done:
            now = time.monotonic()
            if self.fresh is not None and now - self.fresh[0] < self.fresh_for:
                return self.fresh[1]
            if self.started is None:
                self.started, self.runs = now, self.runs + 1
                name = "lta-worker-health"
                threading.Thread(
                    target=self._compute, args=(self.runs,), name=name, daemon=True
                ).start()
            run, since = self.runs, self.started
            if self.waiting < self.max_waiting:
                self.waiting += 1
                try:
                    self.done.wait_for(lambda: self.finished[0] >= run, since + self.wait_s - now)
                finally:
                    self.waiting -= 1
            if self.finished[0] >= run:
                outcome = self.finished[1]
                if isinstance(outcome, BaseException):
                    raise outcome
                return outcome
            waited = time.monotonic() - since
        raise StorageError(
            f"the database does not answer (the status has waited {waited:.0f} s for it)",
            hint="check that the database is up and reachable; the passes wait for it too",
        )


WsgiApp = Callable[["WSGIEnvironment", "StartResponse"], Iterable[bytes]]


def _healthz(health: HealthFn) -> tuple[str, bytes]:
    """`/healthz`: 200 healthy / 503 unhealthy or unknown, a JSON body."""
    try:
        data = health()
        body = {key: data[key] for key in ("healthy", "problems", "generated_at", "version")}
    except LtaError as exc:  # the database cannot be read: that is unhealthy too
        body = {"healthy": False, "problems": [f"status unavailable: {exc.message}"]}
    except Exception as exc:  # a bug: reported, never raised into wsgiref's plain log
        log.error("error", job=HEALTHZ_JOB, error=type(exc).__name__, message=str(exc))
        body = {"healthy": False, "problems": [f"status unavailable: {type(exc).__name__}"]}
    return ("200 OK" if body["healthy"] else "503 Service Unavailable"), json.dumps(body).encode()


def dispatcher(metrics: Metrics, health: HealthFn) -> WsgiApp:
    """`/metrics` to prometheus_client's app, `/healthz` to the status, else 404."""
    metrics_app = make_wsgi_app(metrics.registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            answer: Iterable[bytes] = metrics_app(environ, start_response)
            return answer
        if path == "/healthz":
            status, payload = _healthz(health)
            length = str(len(payload))
            start_response(
                status, [("Content-Type", "application/json"), ("Content-Length", length)]
            )
            return [payload]
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
        health_wait: float = HEALTH_WAIT_S,
    ) -> None:
        server_class = _Server6 if ":" in host else _Server
        try:
            self.server = make_server(
                host,
                port,
                dispatcher(metrics, SharedHealth(health, wait_s=health_wait)),
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
