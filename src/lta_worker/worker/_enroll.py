"""`serve`'s browser enrollment listener: the enrollment app under uvicorn on `enroll.listen`
(the `[web]` extra), in `serve`'s loop, with its defences: a connection cap, a deadline for
each request head, ambiguous framing refused, accept() failures as one rate-limited event.
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
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import urlsplit

import anyio
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from lta_worker.config import start_path, start_url
from lta_worker.enrollment import BrowserFlow, EnrollLinks, build_enroll_app
from lta_worker.errors import ConfigError
from lta_worker.logs import get_logger
from lta_worker.worker._listen import Admission, listen_socket

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from lta_worker.runtime import Runtime

log = get_logger("lta_worker.service")
STOP_TIMEOUT: Final = 5.0
# Seconds a client has to send a whole request head, after its connect or an answer: uvicorn
# times out only idle connections after an answer, and trickling clients took every socket.
REQUEST_DEADLINE: Final = 10.0
# Connections kept at most, and at most a quarter of the descriptor limit (`connection_cap`).
MAX_CONNECTIONS: Final = 256
# The listen backlog: also how many connections asyncio accepts in one go past the cap.
BACKLOG: Final = 64
# asyncio reports every failed accept() each second: one `enroll.accept_failed` per this.
ACCEPT_REPORT_EVERY: Final = 60.0
_SWEEP_EVERY: Final = 0.5  # how often heads past their deadline are looked for
_OUT_OF_RESOURCE: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def connection_cap(descriptor_limit: int) -> int:
    """The listener's connection cap under a soft RLIMIT_NOFILE of `descriptor_limit`."""
    if descriptor_limit == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, descriptor_limit // 4))


class AcceptFailures:
    """accept() calls refused for want of a resource, reported at most once per `every` s."""

    def __init__(self, every: float = ACCEPT_REPORT_EVERY) -> None:
        self.every = every
        self.count = 0  # refused since the last report
        self.reported_at: float | None = None

    def note(self, now: float) -> int | None:
        """One more refusal at `now`: the count to report when a report is due, else None."""
        self.count += 1
        if self.reported_at is not None and now - self.reported_at < self.every:
            return None
        self.reported_at = now
        count, self.count = self.count, 0
        return count


def report_accept_failures(
    admission: Admission,
    previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None,
) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """An asyncio exception handler: accept() out of descriptors or memory becomes one
    `enroll.accept_failed` event per `ACCEPT_REPORT_EVERY`; the rest goes to `previous`."""
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


class Gate:
    """The listener's `Admission`: the protocol class uvicorn runs each connection with (its
    only hook before a head is complete) and ASGI middleware in front of the app, which
    marks a request answered, never cut, and refuses one with both `Content-Length` and
    `Transfer-Encoding` (a body smuggled past a proxy, RFC 9112 6.1).
    """

    def __init__(self, app: ASGIApp, admission: Admission) -> None:
        self.app = app
        self.admission = admission
        self.by_peer: dict[tuple[str, int], asyncio.BaseTransport] = {}

    def protocol(self) -> type[H11Protocol]:
        """The protocol class uvicorn instantiates per connection, under this gate."""
        gate = self

        class Gated(H11Protocol):
            def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
                super().connection_made(transport)
                self.gated = (transport, gate.connected(transport))

            def connection_lost(self, exc: Exception | None) -> None:
                gate.lost(*self.gated)
                super().connection_lost(exc)

        return Gated

    def connected(self, transport: asyncio.BaseTransport) -> tuple[str, int] | None:
        """A new connection: kept (closing the older ones it evicts) or closed."""
        peer = transport.get_extra_info("peername")
        key = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        admitted, evicted = self.admission.admit(transport, time.monotonic())
        for other in evicted:
            cast("asyncio.BaseTransport", other).close()
        if not admitted:  # every kept connection is being answered
            transport.close()
        elif key is not None:
            self.by_peer[key] = transport
        return key

    def lost(self, transport: asyncio.BaseTransport, key: tuple[str, int] | None) -> None:
        """A connection closed: forgotten."""
        self.admission.release(transport)
        if key is not None and self.by_peer.get(key) is transport:
            del self.by_peer[key]

    async def sweep(self) -> None:
        """Close, every `_SWEEP_EVERY` seconds, the connections whose head deadline passed."""
        while True:
            await anyio.sleep(_SWEEP_EVERY)
            for transport in self.admission.expired(time.monotonic()):
                cast("asyncio.BaseTransport", transport).close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        transport = self.by_peer.get((str(client[0]), int(client[1]))) if client else None
        if transport is not None:
            self.admission.head_done(transport)  # a request came: its answer is never cut

        async def answered(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                # Open for its next request: waiting again, with a new deadline.
                self.admission.wait_again(transport, time.monotonic())

        names = {name.lower() for name, _ in scope["headers"]}
        if b"content-length" in names and b"transfer-encoding" in names:
            body = b"Bad Request: both Content-Length and Transfer-Encoding\n"
            headers = [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            await answered({"type": "http.response.start", "status": 400, "headers": headers})
            await answered({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, answered)


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


def enroll_app(runtime: Runtime) -> ASGIApp:
    """The enrollment app over the runtime's collaborators and link keys."""
    settings = runtime.settings
    links = EnrollLinks(runtime.secret("enroll_link_key"), start_url(settings))
    flow = BrowserFlow(runtime.enrollment(), runtime.store, links, runtime.clock.now)
    return build_enroll_app(
        flow,
        start_path=start_path(settings),
        callback_path=urlsplit(settings.client.redirect_uri).path,
        secure=urlsplit(start_url(settings)).scheme == "https",
        return_url=settings.enroll.return_url,
    )


@asynccontextmanager
async def enroll_listener(runtime: Runtime) -> AsyncIterator[None]:
    """Serve the browser enrollment on `enroll.listen` for the duration of the block."""
    settings = runtime.settings
    assert settings.enroll.listen is not None
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    gate = Gate(enroll_app(runtime), Admission(connection_cap(soft_limit), REQUEST_DEADLINE))
    sock = listen_socket(settings.enroll.listen, key="enroll.listen", backlog=BACKLOG)
    sock.setblocking(False)
    logger = logging.getLogger("uvicorn")  # its records are kept off stderr (JSON only)
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
    logger.propagate = False
    config = uvicorn.Config(
        gate,
        log_config=None,
        log_level="warning",
        access_log=False,  # the callback's query holds the authorization code
        lifespan="off",
        ws="none",
        proxy_headers=False,  # `scope["client"]` is the peer, as `Gate` needs
        server_header=False,
        timeout_graceful_shutdown=int(STOP_TIMEOUT),
        backlog=BACKLOG,
        http=gate.protocol(),
    )
    server = _Server(config)

    async def run() -> None:
        try:
            async with anyio.create_task_group() as inner:
                inner.start_soon(gate.sweep)
                await server.serve([sock])
                inner.cancel_scope.cancel()
        finally:
            server.listening.set()  # also when it could not start: the wait below ends

    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(report_accept_failures(gate.admission, previous))
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
                max_connections=gate.admission.cap,
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
