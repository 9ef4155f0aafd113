"""Serving the simulator on one origin (public API at the root, `/auth`, `/_sim`), in-process
or by uvicorn on loopback."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Final

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp

from lta_worker.simulator.control import control_routes
from lta_worker.simulator.core import Simulator
from lta_worker.simulator.responses import SimulatedDrop
from lta_worker.simulator.routes import api_routes, auth_routes

AUTH_PREFIX: Final = "/auth"
CONTROL_PREFIX: Final = "/_sim"
STARTUP_TIMEOUT: Final = 10.0


def build_app(sim: Simulator) -> Starlette:
    """The ASGI app of `sim`: auth service, control API and public API on one origin."""
    app = Starlette(
        routes=[
            Mount(AUTH_PREFIX, routes=auth_routes(sim)),
            Mount(CONTROL_PREFIX, routes=control_routes(sim)),
            *api_routes(sim),
        ]
    )
    app.state.simulator = sim
    return app


def _not_a_drop(record: logging.LogRecord) -> bool:
    """Hides uvicorn's traceback for a simulated drop: it is the intended behaviour."""
    return not isinstance(record.exc_info[1] if record.exc_info else None, SimulatedDrop)


class RunningSimulator:
    """A simulator served by uvicorn on a background thread; a context manager."""

    def __init__(
        self, sim: Simulator, server: uvicorn.Server, thread: threading.Thread, sock: socket.socket
    ) -> None:
        self.sim = sim
        self._server = server
        self._thread = thread
        self._socket = sock
        self.host, self.port = sock.getsockname()[:2]

    @property
    def base_url(self) -> str:
        """The public API's address (`service.base_url`)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def auth_url(self) -> str:
        """The auth service's address (`service.auth_url`)."""
        return self.base_url + AUTH_PREFIX

    @property
    def control_url(self) -> str:
        """The control API's address."""
        return self.base_url + CONTROL_PREFIX

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and wait for the thread to end."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self._socket.close()

    def wait(self) -> None:
        """Block until the server stops (KeyboardInterrupt propagates to the caller)."""
        while self._thread.is_alive():
            self._thread.join(0.5)

    def __enter__(self) -> RunningSimulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_thread(
    sim: Simulator | None = None, host: str = "127.0.0.1", port: int = 0
) -> RunningSimulator:
    """Serve `sim` (a new default one if None) with uvicorn on a background thread; return
    once it listens (port 0 picks a free port).

    Raises:
        OSError: The address cannot be bound.
        RuntimeError: The server did not start within 10 seconds.
    """
    sim = sim or Simulator()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when
    # the listening socket says it is TCP; with protocol 0 every small answer waits for
    # the peer's delayed ACK (about 40 ms on loopback).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    logging.getLogger("uvicorn.error").addFilter(_not_a_drop)  # added once, however called
    config = uvicorn.Config(
        build_app(sim),
        log_config=None,  # leave the host process's logging alone
        log_level="warning",
        access_log=False,
        lifespan="off",
        ws="none",
        # A stall fault sleeps for an hour; do not let it hold the shutdown.
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="lta-simulator", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    if not server.started or not thread.is_alive():
        server.should_exit = True
        thread.join(STARTUP_TIMEOUT)
        sock.close()
        raise RuntimeError("the simulator did not start listening")
    return RunningSimulator(sim, server, thread, sock)


def serve_forever(host: str = "127.0.0.1", port: int = 8765, sim: Simulator | None = None) -> None:
    """Serve until interrupted (Ctrl-C), then stop cleanly."""
    running = start_in_thread(sim, host, port)
    try:
        running.wait()
    finally:
        running.stop()


class _CutStream(httpx.AsyncByteStream):
    """A body that yields what was sent, then fails as a connection closed mid-body does."""

    def __init__(self, partial: bytes, request: httpx.Request) -> None:
        self._partial = partial
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._partial:
            yield self._partial
        raise httpx.RemoteProtocolError(
            "peer closed connection without sending complete message body",
            request=self._request,
        )


class SimulatorTransport(httpx.AsyncBaseTransport):
    """An httpx transport serving a `Simulator` (or its `build_app`) in-process.

    A simulated drop gives what a client of the uvicorn-served simulator gets (status line
    and headers, then `httpx.RemoteProtocolError` on the body), not a `SimulatedDrop`.
    """

    def __init__(self, target: Simulator | ASGIApp) -> None:
        app = build_app(target) if isinstance(target, Simulator) else target
        self._inner = httpx.ASGITransport(app=app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Serve one request; a simulated drop becomes a body that fails to read."""
        try:
            return await self._inner.handle_async_request(request)
        except SimulatedDrop as drop:
            return httpx.Response(
                drop.status,
                headers=drop.headers,
                stream=_CutStream(drop.partial, request),
                request=request,
            )

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self._inner.aclose()
