"""How refusals look on the wire in each error style (docs/simulator.md, "Settings"). A refusal
without a code never carries a word that could pass for one; no message holds a credential.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final

from starlette.responses import JSONResponse, Response

from lta_worker.simulator.state import ErrorStyle

PROBLEM_BASE: Final = "https://api.example/problems/"
REALM: Final = 'Bearer realm="api"'

REVOKED: Final = "PermanentAccessRevoked"
UNLINKED: Final = "NoCloudSyncLinked"
INACTIVE: Final = "CloudSyncInactive"

_MESSAGES: Final[dict[str, str]] = {
    REVOKED: "The long term access was revoked.",
    UNLINKED: "The user's account has no cloud sync linked.",
    INACTIVE: "Cloud sync has been silent for more than 90 days.",
}


@dataclass(frozen=True, slots=True)
class Refusal:
    """A refused request: its status and, when the service names one, an error code."""

    status: int
    code: str | None = None
    message: str | None = None

    def text(self) -> str:
        """A human message: the given one, the code's, or the status phrase."""
        if self.message:
            return self.message
        if self.code in _MESSAGES:
            return _MESSAGES[self.code]
        return HTTPStatus(self.status).phrase


UNAUTHORIZED: Final = Refusal(401)
FORBIDDEN: Final = Refusal(403)
NOT_FOUND: Final = Refusal(404)


def refusal_response(
    refusal: Refusal, style: ErrorStyle, headers: list[tuple[str, str]] | None = None
) -> Response:
    """Render a refusal as an HTTP response in `style`, with extra `headers` appended."""
    extra: list[tuple[str, str]] = []
    if style == "header" and refusal.code:
        extra.append(("WWW-Authenticate", f'Bearer realm="api", error="{refusal.code}"'))
    elif refusal.status == 401:
        extra.append(("WWW-Authenticate", REALM))
    extra += headers or []
    response: Response
    if style == "header":
        response = Response(b"", status_code=refusal.status)
    else:
        response = JSONResponse(
            _body(refusal, style),
            status_code=refusal.status,
            media_type="application/problem+json" if style == "problem" else None,
        )
    return with_headers(response, extra)


def _body(refusal: Refusal, style: ErrorStyle) -> dict[str, Any]:
    code, text = refusal.code, refusal.text()
    if style == "problem":
        if code is None:
            return {"type": "about:blank", "title": text, "status": refusal.status}
        return {
            "type": PROBLEM_BASE + code,
            "title": code,
            "status": refusal.status,
            "detail": text,
        }
    if code is None:
        if style == "nested":
            return {"errors": [{"message": text}]}
        return {"message": text}
    if style == "code":
        return {"code": code}
    if style == "nested":
        return {"errors": [{"code": code, "message": text}]}
    return {"error": code, "message": text}


def with_headers(response: Response, headers: list[tuple[str, str]]) -> Response:
    """Append `headers` to `response` (repeated names are kept) and return it."""
    for name, value in headers:
        response.headers.append(name, value)
    return response


def json_response(
    payload: Any, status: int = 200, headers: list[tuple[str, str]] | None = None
) -> Response:
    """A JSON answer with `headers` appended (repeated header names are kept)."""
    return with_headers(JSONResponse(payload, status_code=status), headers or [])
