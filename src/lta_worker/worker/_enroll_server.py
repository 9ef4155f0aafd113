"""`serve`'s browser enrollment listener: the enrollment app under uvicorn, on `enroll.listen`.

Imported only when `enroll.listen` is set (starlette and uvicorn are the `[web]` extra).
The socket is bound before `serve` reports READY, so a taken or forbidden address stops
the service at once (exit 78, naming `enroll.listen`). uvicorn runs as a task of `serve`'s
event loop, with its own signal handling off (the service owns SIGTERM, SIGINT and SIGHUP),
its access log off (a callback URL holds the authorization code) and its own records kept
off stderr (only JSON lines go there). At the service's stop, the listener closes after the
last pass has drained.

Connections: at most a cap, with a deadline for each request head (`Admission`, shared with
the metrics server); a request with both `Content-Length` and `Transfer-Encoding` is refused
and its connection closed; accept() running out of descriptors is one rate-limited event.

The flow uses the runtime's store, vault and API client (which holds the client secret,
renewed by a SIGHUP); the link keys and the `[enroll]` settings are read once at the start
(a SIGHUP does not change them: restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import time
from collections.abc import AsyncIterator, Callable, Generator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Final, cast
from urllib.parse import urlsplit

import anyio
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from lta_worker.config import parse_listen, start_path, start_url
from lta_worker.enrollment import BrowserFlow, EnrollLinks, build_enroll_app
from lta_worker.errors import ConfigError
from lta_worker.logs import get_logger
from lta_worker.worker._admission import Admission

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from lta_worker.worker._root import Runtime

log = get_logger("lta_worker.service")
STOP_TIMEOUT: Final = 5.0
# Seconds a client has to send a whole request head, after it connects or after an answer.
# uvicorn times a connection out only after an answer, and only while no byte comes: an
# idle or trickling client (slowloris) would hold its descriptor for good, and about 1,100
# of them took the passes' database and HTTP connections.
REQUEST_DEADLINE: Final = 10.0
# Connections kept at most (`Admission`: past it, a new one takes the place of the oldest
# still sending its head), and never more than a quarter of the process's descriptor limit:
# the rest is for the passes, the database and the service.
MAX_CONNECTIONS: Final = 256
# The listen backlog, which is also how many connections asyncio accepts in one go before
# those past the cap are closed: at most this many descriptors above the cap, for a moment.
BACKLOG: Final = 64
# When accept() fails for want of descriptors, asyncio (3.11) reports every attempt of its
# accept loop, each second: one `enroll.accept_failed` event per this many seconds instead.
ACCEPT_REPORT_EVERY: Final = 60.0
_SWEEP_EVERY: Final = 0.5  # how often heads past their deadline are looked for
_OUT_OF_RESOURCE: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def connection_cap(descriptor_limit: int) -> int:
    """The listener's connection cap under a soft RLIMIT_NOFILE of `descriptor_limit`."""
    if descriptor_limit == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, descriptor_limit // 4))


class AcceptFailures:
    """accept() calls refused for want of a resource: counted, reported at most once per
    `every` seconds (pure: `now` passed in)."""

    def __init__(self, every: float = ACCEPT_REPORT_EVERY) -> None:
        self.every = every
        self.count = 0  # refused since the last report
        self.reported_at: float | None = None

    def note(self, now: float) -> int | None:
        """One more refusal at `now`: the count to report (this one included) when a report
        is due, else None."""
        self.count += 1
        if self.reported_at is not None and now - self.reported_at < self.every:
            return None
        self.reported_at = now
        count, self.count = self.count, 0
        return count


class _GatedProtocol(H11Protocol):
    """uvicorn's h11 protocol under the listener's `Admission`: at most its cap of
    connections, the oldest still waiting for its request head closed to make room, and
    each closed when its head has not come `REQUEST_DEADLINE` after the connect or the last
    answer (a request being answered is never cut)."""

    admission: ClassVar[Admission]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        admitted, evicted = self.admission.admit(self, time.monotonic())
        for other in evicted:
            cast(_GatedProtocol, other).transport.close()
        if not admitted:  # every kept connection is being answered
            transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self.admission.head_done(self)  # a request came: its answer is never cut

    def on_response_complete(self) -> None:
        # Before uvicorn reads a pipelined request (which `handle_events` then marks).
        self.admission.wait_again(self, time.monotonic())
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.admission.release(self)
        super().connection_lost(exc)


def _gated(admission: Admission) -> type[H11Protocol]:
    """The protocol class uvicorn instantiates per connection, bound to `admission`."""

    class Gated(_GatedProtocol):
        pass

    Gated.admission = admission
    return Gated


async def _sweep(admission: Admission) -> None:
    """Close, every `_SWEEP_EVERY` seconds, the connections whose head deadline passed."""
    while True:
        await anyio.sleep(_SWEEP_EVERY)
        for conn in admission.expired(time.monotonic()):
            cast(_GatedProtocol, conn).transport.close()


def _report_accept_failures(
    admission: Admission,
    previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None,
) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """An asyncio exception handler: accept() out of descriptors or memory becomes one
    `enroll.accept_failed` event per `ACCEPT_REPORT_EVERY` (never plain tracebacks on
    stderr); anything else goes to `previous` (or asyncio's default)."""
    failures = AcceptFailures()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCE:
            count = failures.note(time.monotonic())
            if count is not None:
                log.error(
                    "enroll.accept_failed",
                    error=errno.errorcode[exc.errno],
                    count=count,
                    connections=admission.kept,
                    max_connections=admission.cap,
                    hint="raise the descriptor limit (LimitNOFILE= of the unit), "
                    "and keep the listener behind a reverse proxy",
                )
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    return handle


class _Server(uvicorn.Server):
    """uvicorn, with the service's own signal handling left alone; tells when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = anyio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """Install no handler: `serve` receives the signals and stops this server."""
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start as uvicorn does, then set `listening`."""
        await super().startup(sockets=sockets)
        self.listening.set()


def _quiet_uvicorn_logs() -> None:
    logger = logging.getLogger("uvicorn")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
    logger.propagate = False


def bind(listen: str) -> socket.socket:
    """A listening TCP socket on `HOST:PORT`.

    Raises:
        ConfigError: naming `enroll.listen`, when the address cannot be bound.
    """
    host, port = parse_listen(listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family = infos[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {listen} ({exc})", key="enroll.listen") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(infos[0][4])
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {listen} ({exc.strerror})", key="enroll.listen"
        ) from None
    sock.setblocking(False)
    return sock


class _RefuseAmbiguousFraming:
    """ASGI middleware: a request with both `Content-Length` and `Transfer-Encoding` gets a
    400 with `Connection: close` and never reaches the app.

    Its body's end is ambiguous, and a proxy in front may have framed it the other way: what
    h11 reads as the next request may be one smuggled in the body (RFC 9112 section 6.1 says
    to close the connection after such a request). h11 frames by `Transfer-Encoding`, and on
    `Connection: close` in the answer it closes the connection, so the bytes after the body
    are never read as a request.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope["headers"]}
            if b"content-length" in names and b"transfer-encoding" in names:
                body = b"Bad Request: both Content-Length and Transfer-Encoding\n"
                await send(
                    {
                        "type": "http.response.start",
                        "status": 400,
                        "headers": [
                            (b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def enroll_app(runtime: Runtime) -> ASGIApp:
    """The enrollment app over the runtime's collaborators and link keys, behind
    `_RefuseAmbiguousFraming`."""
    settings = runtime.settings
    links = EnrollLinks(runtime.secret("enroll_link_key"), start_url(settings))
    flow = BrowserFlow(runtime.enrollment(), runtime.store, links, runtime.clock.now)
    app = build_enroll_app(
        flow,
        start_path=start_path(settings),
        callback_path=urlsplit(settings.client.redirect_uri).path,
        secure=urlsplit(start_url(settings)).scheme == "https",
        return_url=settings.enroll.return_url,
    )
    return _RefuseAmbiguousFraming(app)


@asynccontextmanager
async def enroll_listener(runtime: Runtime) -> AsyncIterator[None]:
    """Serve the browser enrollment on `enroll.listen` for the duration of the block."""
    settings = runtime.settings
    assert settings.enroll.listen is not None
    app = enroll_app(runtime)
    sock = bind(settings.enroll.listen)
    _quiet_uvicorn_logs()
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    admission = Admission(connection_cap(soft_limit), REQUEST_DEADLINE)
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,  # the callback's query holds the authorization code
        lifespan="off",
        ws="none",
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=int(STOP_TIMEOUT),
        backlog=BACKLOG,
        http=_gated(admission),
    )
    server = _Server(config)

    async def run() -> None:
        try:
            async with anyio.create_task_group() as inner:
                inner.start_soon(_sweep, admission)
                await server.serve([sock])
                inner.cancel_scope.cancel()
        finally:
            server.listening.set()  # also when it could not start: the wait below ends

    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(_report_accept_failures(admission, previous))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await server.listening.wait()
            if not server.started:
                raise ConfigError("the enrollment listener did not start", key="enroll.listen")
            log.info(
                "enroll.listening",
                listen=settings.enroll.listen,
                start_url=start_url(settings),
                callback=settings.client.redirect_uri,
                max_connections=admission.cap,
            )
            try:
                yield
            finally:
                # uvicorn sees the flag within 0.1 s, lets open requests finish, and returns.
                server.should_exit = True
                tg.cancel_scope.deadline = anyio.current_time() + STOP_TIMEOUT + 1
    finally:
        loop.set_exception_handler(previous)
        sock.close()
