"""The account and authorization service, mounted at `{auth_url}` (`/auth` on the one origin).

Consent, code exchange, and creation and drop of long term tokens. None of these count
against the public API's budget: they are a different service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from lta_worker.simulator.responses import refusal_response, with_headers

if TYPE_CHECKING:
    from lta_worker.simulator.core import Simulator

NO_STORE = [("Cache-Control", "no-store")]


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
        if answer.location is None:
            return PlainTextResponse(answer.text or "Bad request", status_code=400)
        return with_headers(RedirectResponse(answer.location, status_code=302), NO_STORE)

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
        Route("/oidc/token", token, methods=["POST"]),
        Route("/api/long-term-access/tokens", create, methods=["POST"]),
        Route("/api/long-term-access/tokens", drop, methods=["DELETE"]),
    ]
