"""`serve`'s browser enrollment listener: the enrollment app under uvicorn, on `enroll.listen`.

Imported only when `enroll.listen` is set (starlette and uvicorn are the `[web]` extra).
The socket is bound before `serve` reports READY, so a taken or forbidden address stops
the service at once (exit 78, naming `enroll.listen`). uvicorn runs as a task of `serve`'s
event loop, with its own signal handling off (the service owns SIGTERM, SIGINT and SIGHUP),
its access log off (a callback URL holds the authorization code) and its own records kept
off stderr (only JSON lines go there). At the service's stop, the listener closes after the
last pass has drained.

The flow uses the worker's store, vault, API client and client secret; the link keys and the
`[enroll]` settings are read once at the start (a SIGHUP does not change them: restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

import anyio
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from lta_worker.config import Settings, parse_listen, read_link_keys, start_path, start_url
from lta_worker.enrollment import BrowserFlow, EnrollLinks, Enrollment, build_enroll_app
from lta_worker.errors import ConfigError
from lta_worker.logs import get_logger

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from lta_worker.worker._runtime import Worker

log = get_logger("lta_worker.service")
STOP_TIMEOUT: Final = 5.0
# Seconds a client has to send a whole request head, after it connects or after an answer.
# uvicorn times a connection out only after an answer, and only while no byte comes: an
# idle or trickling client (slowloris) would hold its descriptor for good, and about 1,100
# of them took the passes' database and HTTP connections.
REQUEST_DEADLINE: Final = 10.0


class _DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection that has not sent a whole request head
    within `REQUEST_DEADLINE` (a request being answered is never cut)."""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(REQUEST_DEADLINE, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        busy = self.cycle is not None and not self.cycle.response_complete
        if busy:  # a request came and is being answered; the next one gets its own time
            return
        if not self.transport.is_closing():
            self.transport.close()


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
        sock.listen(128)
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


def enroll_app(worker: Worker, settings: Settings) -> ASGIApp:
    """The enrollment app over the worker's collaborators (the link keys read now), behind
    `_RefuseAmbiguousFraming`."""
    enrollment = Enrollment(
        settings,
        worker.store,
        worker.vault,
        worker.api,
        worker.clock.now,
        client_secret=worker.client_secret,
    )
    links = EnrollLinks(read_link_keys(settings), start_url(settings))
    flow = BrowserFlow(enrollment, worker.store, links, worker.clock.now)
    app = build_enroll_app(
        flow,
        start_path=start_path(settings),
        callback_path=urlsplit(settings.client.redirect_uri).path,
        secure=urlsplit(start_url(settings)).scheme == "https",
        return_url=settings.enroll.return_url,
    )
    return _RefuseAmbiguousFraming(app)


@asynccontextmanager
async def enroll_listener(worker: Worker, settings: Settings) -> AsyncIterator[None]:
    """Serve the browser enrollment on `enroll.listen` for the duration of the block."""
    assert settings.enroll.listen is not None
    app = enroll_app(worker, settings)
    sock = bind(settings.enroll.listen)
    _quiet_uvicorn_logs()
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
        http=_DeadlineProtocol,
    )
    server = _Server(config)

    async def run() -> None:
        try:
            await server.serve([sock])
        finally:
            server.listening.set()  # also when it could not start: the wait below ends

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
            )
            try:
                yield
            finally:
                # uvicorn sees the flag within 0.1 s, lets open requests finish, and returns.
                server.should_exit = True
                tg.cancel_scope.deadline = anyio.current_time() + STOP_TIMEOUT + 1
    finally:
        sock.close()
