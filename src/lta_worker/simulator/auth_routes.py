"""The account and authorization service, mounted at `{auth_url}` (`/auth` on the one origin).

Consent (queued, auto-approved, or on the consent page `/oidc/auth` shows and
`/oidc/consent` answers), code exchange, and creation and drop of long term tokens. None of
these count against the public API's budget: they are a different service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route

from lta_worker.simulator.consent_page import render_consent
from lta_worker.simulator.responses import refusal_response, with_headers

if TYPE_CHECKING:
    from lta_worker.simulator.core import Simulator

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


def auth_routes(sim: Simulator) -> list[Route]:
    """The routes of the auth service, bound to `sim` (paths relative to the mount)."""

    async def authorize(request: Request) -> Response:
        answer = sim.handle_authorize(request.url.path, dict(request.query_params))
        if answer.page is not None:
            action = request.url.path.removesuffix("/auth") + "/consent"
            return with_headers(HTMLResponse(render_consent(answer.page, action)), PAGE_HEADERS)
        if answer.location is None:
            return PlainTextResponse(answer.text or "Bad request", status_code=400)
        return with_headers(RedirectResponse(answer.location, status_code=302), NO_STORE)

    async def consent(request: Request) -> Response:
        body = (await request.body())[:MAX_FORM].decode("utf-8", "replace")
        form: dict[str, list[str]] = {}
        for key, value in parse_qsl(body, keep_blank_values=True):
            form.setdefault(key, []).append(value)
        answer = sim.handle_consent(request.url.path, form)
        if answer.location is None:
            return PlainTextResponse(answer.text or "Bad request", status_code=400)
        return with_headers(RedirectResponse(answer.location, status_code=303), NO_STORE)

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
