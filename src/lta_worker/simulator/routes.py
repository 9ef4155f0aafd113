"""The HTTP routes of the public API (`{base_url}`) and the auth service (`{auth_url}`, not
counted against the API's budget). Faults wait here, outside the simulator's lock."""

from __future__ import annotations

import html
import json
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

from lta_worker.simulator.oauth import ConsentPage
from lta_worker.simulator.responses import (
    DropResponse,
    broken_json,
    error_response,
    json_response,
    refusal_response,
    with_headers,
)
from lta_worker.simulator.state import Endpoint

if TYPE_CHECKING:
    from lta_worker.simulator.core import PublicAnswer, Simulator

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
    return json_response(answer.payload, 200, answer.headers)


async def _apply_fault(sim: Simulator, answer: PublicAnswer) -> Response:
    fault = answer.fault
    if fault is None:
        return _render(sim, answer)
    if fault.kind in {"latency", "stall"}:
        await sim.sleep(fault.delay)
        return _render(sim, answer)
    if fault.kind == "drop":
        return DropResponse()
    if fault.kind == "broken_json":
        body = json.dumps(answer.payload).encode() if answer.payload is not None else b""
        return broken_json(body, answer.headers)
    return error_response(fault.kind, answer.headers)


def api_routes(sim: Simulator) -> list[Route]:
    """The routes of the public API, bound to `sim`."""

    def read_endpoint(endpoint: Endpoint) -> Route:
        async def read(request: Request) -> Response:
            answer = sim.handle_read(
                endpoint,
                request.url.path,
                request.headers.get("authorization"),
                request.headers.get("ds-api-client-id"),
                method=request.method,
            )
            return await _apply_fault(sim, answer)

        path = next(p for p, e in READ_PATHS.items() if e == endpoint)
        return Route(path, read, methods=["GET"])

    async def regular_only(request: Request) -> Response:
        answer = sim.handle_other(
            request.url.path,
            request.headers.get("authorization"),
            request.headers.get("ds-api-client-id"),
            method=request.method,
        )
        return _render(sim, answer)

    routes = [read_endpoint(e) for e in READ_PATHS.values()]
    routes += [Route(p, regular_only, methods=["GET"]) for p in REGULAR_ONLY_PATHS]
    return routes


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
