"""`serve`'s browser enrollment listener: the enrollment app under uvicorn, on `enroll.listen`.

Imported only when `enroll.listen` is set (starlette and uvicorn are the `[web]` extra).
The socket is bound before `serve` reports READY, so a taken or forbidden address stops
the service at once (exit 78, naming `enroll.listen`). uvicorn runs as a task of `serve`'s
event loop, with its own signal handling off (the service owns SIGTERM, SIGINT and SIGHUP),
its access log off (a callback URL holds the authorization code) and its own records kept
off stderr (only JSON lines go there). At the service's stop, the listener closes after the
last pass has drained.

Connections are guarded by `_enroll_guard`: a cap, a deadline for each request head,
ambiguous framing refused, accept() out of descriptors one rate-limited event.

The flow uses the runtime's store, vault and API client (which holds the client secret,
renewed by a SIGHUP); the link keys and the `[enroll]` settings are read once at the start
(a SIGHUP does not change them: restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

import anyio
import uvicorn

from lta_worker.config import start_path, start_url
from lta_worker.enrollment import BrowserFlow, EnrollLinks, build_enroll_app
from lta_worker.errors import ConfigError
from lta_worker.logs import get_logger
from lta_worker.worker._admission import Admission
from lta_worker.worker._enroll_guard import (
    BACKLOG,
    REQUEST_DEADLINE,
    RefuseAmbiguousFraming,
    connection_cap,
    gated,
    report_accept_failures,
    sweep,
)
from lta_worker.worker._listen import listen_socket

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from lta_worker.runtime import Runtime

log = get_logger("lta_worker.service")
STOP_TIMEOUT: Final = 5.0


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


def enroll_app(runtime: Runtime) -> ASGIApp:
    """The enrollment app over the runtime's collaborators and link keys, behind
    `RefuseAmbiguousFraming`."""
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
    return RefuseAmbiguousFraming(app)


@asynccontextmanager
async def enroll_listener(runtime: Runtime) -> AsyncIterator[None]:
    """Serve the browser enrollment on `enroll.listen` for the duration of the block."""
    settings = runtime.settings
    assert settings.enroll.listen is not None
    app = enroll_app(runtime)
    sock = listen_socket(settings.enroll.listen, key="enroll.listen", backlog=BACKLOG)
    sock.setblocking(False)
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
        http=gated(admission),
    )
    server = _Server(config)

    async def run() -> None:
        try:
            async with anyio.create_task_group() as inner:
                inner.start_soon(sweep, admission)
                await server.serve([sock])
                inner.cancel_scope.cancel()
        finally:
            server.listening.set()  # also when it could not start: the wait below ends

    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(report_accept_failures(admission, previous))
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
