"""Serving the simulator on one origin: the public API at the root (`base_url`), the auth
service under `/auth` (`auth_url`, not counted against the API's budget) and the control API
under `/_sim`; in-process or by uvicorn on loopback. Faults wait here, outside the lock."""

from __future__ import annotations

import html
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Final
from urllib.parse import parse_qsl

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.types import ASGIApp

from lta_worker.simulator.control import control_routes
from lta_worker.simulator.core import PublicAnswer, Simulator
from lta_worker.simulator.oauth import AuthorizeAnswer, ConsentPage
from lta_worker.simulator.responses import (
    DropResponse,
    SimulatedDrop,
    error_response,
    refusal_response,
    with_headers,
)
from lta_worker.simulator.state import Endpoint

AUTH_PREFIX: Final = "/auth"
CONTROL_PREFIX: Final = "/_sim"
STARTUP_TIMEOUT: Final = 10.0


READ_PATHS: dict[str, Endpoint] = {
    "/api/v1/history/latest-change": "latest-change",
    "/api/v1/history/stats": "stats",
}
# Spec 1: these accept a regular user token only, even from a client with the mode.
REGULAR_ONLY_PATHS = (
    "/api/v1/history/changes",
    "/api/v1/history/accidents",
    "/api/v1/stocks",
    "/api/v1/types",
)


def _render(sim: Simulator, answer: PublicAnswer) -> Response:
    if answer.refusal is not None:
        return refusal_response(answer.refusal, sim.settings.error_style, answer.headers)
    return with_headers(JSONResponse(answer.payload), answer.headers)


async def _apply_fault(sim: Simulator, answer: PublicAnswer) -> Response:
    fault = answer.fault
    if fault is None:
        return _render(sim, answer)
    if fault.kind in {"latency", "stall"}:
        await sim.sleep(fault.delay)
        return _render(sim, answer)
    if fault.kind == "drop":
        return DropResponse()
    if fault.kind == "broken_json":  # a 200 whose JSON body is cut in half
        body = json.dumps(answer.payload).encode() if answer.payload is not None else b""
        cut = body[: max(1, len(body) // 2)] if len(body) > 2 else b'{"id": '
        return with_headers(Response(cut, 200, media_type="application/json"), answer.headers)
    return error_response(fault.kind, answer.headers)


def api_routes(sim: Simulator) -> list[Route]:
    """The routes of the public API, bound to `sim`."""

    async def read(request: Request) -> Response:
        answer = sim.handle_read(
            READ_PATHS[request.url.path],
            request.url.path,
            request.headers.get("authorization"),
            request.headers.get("ds-api-client-id"),
            method=request.method,
        )
        return await _apply_fault(sim, answer)

    async def regular_only(request: Request) -> Response:
        answer = sim.handle_other(
            request.url.path,
            request.headers.get("authorization"),
            request.headers.get("ds-api-client-id"),
            method=request.method,
        )
        return _render(sim, answer)

    routes = [Route(p, read, methods=["GET"]) for p in READ_PATHS]
    return routes + [Route(p, regular_only, methods=["GET"]) for p in REGULAR_ONLY_PATHS]


_LABELS = {
    "cloud-sync.permanent.latest-change": "Read your latest change, at any time",
    "cloud-sync.permanent.stats": "Read your statistics, at any time",
    "cloud-sync.history": "Read your history",
}


def render_consent(page: ConsentPage, action: str) -> str:
    """The consent page of `page`, posting to `action`: one plain HTML form, no script, every
    value escaped; the scopes the user leaves ticked are the scopes granted."""
    esc = html.escape
    boxes = "".join(
        f'<div><input type="checkbox" id="scope-{n}" name="scope" value="{esc(scope)}" checked>'
        f' <label for="scope-{n}">{esc(_LABELS.get(scope, scope))} '
        f"(<code>{esc(scope)}</code>)</label></div>\n"
        for n, scope in enumerate(page.scopes)
    )
    return f"""<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Allow access? (simulator)</title></head>
<body>
<main>
<h1>Allow <strong>{esc(page.client)}</strong> to access your account?</h1>
<form method="post" action="{esc(action)}">
<input type="hidden" name="request" value="{esc(page.request_id)}">
<p><label for="account">Signed in as</label>
<input type="text" id="account" name="account" value="{esc(page.account)}" required></p>
<fieldset><legend>What it may do (untick what you do not want to share)</legend>
{boxes}</fieldset>
<p><button type="submit" id="allow" name="decision" value="allow">Allow</button>
<button type="submit" id="deny" name="decision" value="deny">Deny</button></p>
</form>
</main>
</body>
</html>
"""


NO_STORE = [("Cache-Control", "no-store")]
PAGE_HEADERS = [
    *NO_STORE,
    # No form-action: browsers apply it to the redirect that follows the form (to the
    # client's callback, another origin), as the real consent screen must allow.
    ("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'"),
    ("Referrer-Policy", "no-referrer"),
]
MAX_FORM = 16_384


def _form(body: bytes) -> dict[str, str] | None:
    """Parse an urlencoded body; None when it is not one or repeats a parameter."""
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(body))
    except (UnicodeDecodeError, ValueError):
        return None
    form = dict(pairs)
    # RFC 6749 3.2: a parameter must not be included more than once.
    return form if len(form) == len(pairs) else None


def _redirect(answer: AuthorizeAnswer, status: int) -> Response:
    if answer.location is None:
        return PlainTextResponse(answer.text or "Bad request", status_code=400)
    return with_headers(RedirectResponse(answer.location, status_code=status), NO_STORE)


def auth_routes(sim: Simulator) -> list[Route]:
    """The routes of the auth service, bound to `sim` (paths relative to the mount)."""

    async def authorize(request: Request) -> Response:
        answer = sim.handle_authorize(request.url.path, dict(request.query_params))
        if answer.page is not None:
            action = request.url.path.removesuffix("/auth") + "/consent"
            return with_headers(HTMLResponse(render_consent(answer.page, action)), PAGE_HEADERS)
        return _redirect(answer, 302)

    async def consent(request: Request) -> Response:
        body = (await request.body())[:MAX_FORM].decode("utf-8", "replace")
        form: dict[str, list[str]] = {}
        for key, value in parse_qsl(body, keep_blank_values=True):
            form.setdefault(key, []).append(value)
        return _redirect(sim.handle_consent(request.url.path, form), 303)

    async def token(request: Request) -> Response:
        form = _form(await request.body())
        answer = sim.handle_token(request.url.path, form, request.headers.get("authorization"))
        return with_headers(JSONResponse(answer.body, status_code=answer.status), answer.headers)

    async def create(request: Request) -> Response:
        answer = sim.handle_enroll(request.url.path, request.headers.get("authorization"))
        if answer.refusal is not None:
            return refusal_response(answer.refusal, sim.settings.error_style)
        return with_headers(JSONResponse(answer.body, status_code=answer.status), NO_STORE)

    async def drop(request: Request) -> Response:
        sim.handle_drop(request.url.path, request.headers.get("authorization"))
        return Response(status_code=204)

    return [
        Route("/oidc/auth", authorize, methods=["GET"]),
        Route("/oidc/consent", consent, methods=["POST"]),
        Route("/oidc/token", token, methods=["POST"]),
        Route("/api/long-term-access/tokens", create, methods=["POST"]),
        Route("/api/long-term-access/tokens", drop, methods=["DELETE"]),
    ]


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
