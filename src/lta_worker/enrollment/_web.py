"""The browser enrollment as a Starlette app (the `[web]` extra; docs/operations.md,
"Enrollment in the browser"): one small HTML page per outcome, no script, values escaped.
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from lta_worker.enrollment._browser import FlowStopped
from lta_worker.enrollment._links import START_QUERY
from lta_worker.logs import get_logger
from lta_worker.protocol import LATEST_CHANGE_SCOPE, STATS_SCOPE

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from lta_worker.enrollment._browser import BrowserFlow, Outcome

_STYLE: Final = (
    "body{font-family:system-ui,sans-serif;line-height:1.5;margin:0;color:#1a1a1a;"
    "background:#fff}main{max-width:36rem;margin:3rem auto;padding:0 1rem}"
    "h1{font-size:1.5rem}"
)
_STYLE_HASH: Final = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()

SECURITY_HEADERS: Final[Mapping[str, str]] = {
    "content-security-policy": (
        f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}

_NEW_LINK: Final = "Please ask for a new link."
#: title and explanation of each outcome (`BrowserFlow`'s kinds, plus `not_found`).
TEXTS: Final[Mapping[str, tuple[str, str]]] = {
    "enrolled": ("Access granted", "Thank you. Access is set up for: {scopes}."),
    "denied": (
        "Access not granted",
        "You chose not to allow access; nothing was shared. If that was a mistake, ask "
        "for a new link.",
    ),
    "link_invalid": (
        "This link does not work",
        "The link is incomplete or was changed. Copy the whole link, or ask for a new one.",
    ),
    "link_expired": ("This link has expired", _NEW_LINK),
    "link_used": ("This link was already used", "Each link works once. " + _NEW_LINK),
    "no_cookie": (
        "Your request could not be checked",
        "Open the link and finish in the same browser, with cookies allowed for this site, "
        "within 10 minutes. " + _NEW_LINK,
    ),
    "state_mismatch": (
        "This answer does not match your request",
        "Another request was started in this browser since, or the answer was not meant "
        "for it. " + _NEW_LINK,
    ),
    "consent_expired": (
        "This request has expired",
        "A request must be finished within 10 minutes, once. " + _NEW_LINK,
    ),
    "not_available": (
        "Not available yet",
        "Access cannot be granted to this application yet; nothing was shared. "
        "Please try again later.",
    ),
    "failed": (
        "Something went wrong",
        "Access could not be set up this time; nothing was changed. Please try again "
        "later with a new link.",
    ),
    "bad_request": ("Nothing to do here", "This address only receives the answer of a request."),
    "not_found": ("Page not found", "There is no page at this address."),
}
SCOPE_WORDS: Final[Mapping[str, str]] = {
    LATEST_CHANGE_SCOPE: "your latest change",
    STATS_SCOPE: "your statistics",
}


def render(kind: str, scopes: tuple[str, ...] = ()) -> str:
    """The HTML page of an outcome (`TEXTS`' keys); scopes name what was granted."""
    title, text = TEXTS[kind]
    granted = ", ".join(SCOPE_WORDS.get(s, s) for s in scopes) or "nothing"
    body = html.escape(text.format(scopes=granted))
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n"
        f'<body>\n<main>\n<h1 id="outcome" data-outcome="{html.escape(kind)}">'
        f"{html.escape(title)}</h1>\n<p>{body}</p>\n</main>\n</body>\n</html>\n"
    )


COOKIE_TTL: Final = 600


log = get_logger("lta_worker.enroll_web")


class SecurityHeaders:
    """ASGI middleware: adds `SECURITY_HEADERS` to every answer, error pages included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to the start of the answer."""

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                known = {name.lower() for name, _ in message.get("headers", [])}
                extra = [
                    (name.encode(), value.encode())
                    for name, value in SECURITY_HEADERS.items()
                    if name.encode() not in known
                ]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def build_enroll_app(
    flow: BrowserFlow,
    *,
    start_path: str,
    callback_path: str,
    secure: bool,
    return_url: str | None = None,
) -> ASGIApp:
    """The ASGI app of the browser enrollment (`secure`: a `__Host-` Secure cookie;
    `return_url`: outcomes redirect there instead of showing a page)."""
    # Imported here, so that the package's face imports without the `[web]` extra.
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, RedirectResponse, Response
    from starlette.routing import Route

    # Over https the `__Host-` prefix binds the cookie to the exact host (Secure, Path=/).
    name = "__Host-lta-enroll" if secure else "lta-enroll"

    def answer(outcome: Outcome, path: str) -> Response:
        emit = log.info if outcome.kind == "enrolled" else log.warning
        emit(
            "enroll.page",
            path=path,
            outcome=outcome.kind,
            status=outcome.status,
            user=outcome.user,
            error=outcome.error,
        )
        if return_url is not None:
            glue = "&" if "?" in return_url else "?"
            return RedirectResponse(f"{return_url}{glue}{outcome.query()}", status_code=303)
        return HTMLResponse(render(outcome.kind, outcome.scopes), status_code=outcome.status)

    def head(path: str) -> Response:
        # Link checkers and mail scanners send HEAD first: it must not use a link or code.
        log.info("enroll.page", path=path, outcome="head", status=200, user=None)
        return Response(status_code=200, media_type="text/html")

    async def start(request: Request) -> Response:
        if request.method == "HEAD":
            return head(start_path)
        try:
            started = await flow.start(request.query_params.get(START_QUERY))
        except FlowStopped as stop:
            return answer(stop.outcome, start_path)
        log.info("enroll.page", path=start_path, outcome="consent", status=303, user=started.user)
        response = RedirectResponse(started.consent_url, status_code=303)
        response.set_cookie(
            name,
            started.cookie.reveal(),
            max_age=COOKIE_TTL,
            path="/",
            secure=secure,
            httponly=True,
            samesite="lax",
        )
        return response

    async def callback(request: Request) -> Response:
        if request.method == "HEAD":
            return head(callback_path)
        params = {k: v for k, v in request.query_params.items() if k in {"code", "state", "error"}}
        outcome = await flow.callback(params, request.cookies.get(name))
        response = answer(outcome, callback_path)
        response.delete_cookie(name, path="/", secure=secure, httponly=True, samesite="lax")
        return response

    async def not_found(request: Request, exc: Exception) -> Response:
        return HTMLResponse(render("not_found"), status_code=404)

    async def bug(request: Request, exc: Exception) -> Response:
        # A bug: logged here with its traceback (frames without locals, secrets masked);
        # uvicorn's own records are kept off the log stream.
        log.error(
            "enroll.page",
            path=request.url.path,
            outcome="failed",
            status=500,
            user=None,
            error=type(exc).__name__,
            exc_info=True,
        )
        return HTMLResponse(render("failed"), status_code=500)

    app = Starlette(
        routes=[
            Route(start_path, start, methods=["GET"]),
            Route(callback_path, callback, methods=["GET"]),
        ],
        exception_handlers={404: not_found, Exception: bug},
    )
    # Starlette answers `/path/` with a redirect to `/path` built from the request's Host
    # header, over the listener's own scheme, query (link, code) included: a 404 instead.
    app.router.redirect_slashes = False
    return SecurityHeaders(app)
