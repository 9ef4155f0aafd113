"""How answers go wrong on the wire: refusals in each error style (docs/simulator.md,
"Settings"; a refusal without a code carries no word that could pass for one), and the
faults injected on the reads (at most one a read).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any, Final, Literal, get_args

from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

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


# -- injected faults on the public reads ------------------------------------------------

FaultKind = Literal["500", "502", "503", "drop", "broken_json", "latency", "stall"]
FAULT_KINDS: Final[tuple[FaultKind, ...]] = get_args(FaultKind)
STALL_SECONDS: Final = 3600.0
DROP_DECLARED_LENGTH: Final = 2048


class SimulatedDrop(Exception):
    """Raised by `DropResponse` after a partial answer, to make the server drop the connection."""

    def __init__(self, status: int, headers: list[tuple[str, str]], partial: bytes) -> None:
        super().__init__("simulated dropped connection")
        self.status = status
        self.headers = headers
        self.partial = partial


@dataclass(slots=True)
class FaultRule:
    """One kind of fault and when it fires: on the `remaining` next reads, else with
    probability `rate`; `delay` is the wait of `latency` and `stall`, in seconds."""

    kind: FaultKind
    rate: float | None = None
    remaining: int | None = None
    delay: float = 0.0


class FaultPlan:
    """The active fault rules and their seeded generator (None: from the OS); not thread-safe."""

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self._rng = random.Random(seed)
        self.rules: list[FaultRule] = []

    def reseed(self, seed: int | None) -> None:
        """Restart the generator from `seed` (same seed, same reads: same faults)."""
        self.seed = seed
        self._rng = random.Random(seed)

    def add(
        self,
        kind: str,
        *,
        rate: float | None = None,
        count: int | None = None,
        delay: float | None = None,
    ) -> FaultRule:
        """Add a rule: fire on the next `count` reads, or with probability `rate`.

        Raises:
            ValueError: Unknown kind, or not exactly one of a rate in 0..1 and a count >= 1.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
        if (rate is None) == (count is None):
            raise ValueError("give exactly one of rate (0..1) and next (a count)")
        if rate is not None and not 0.0 <= rate <= 1.0:
            raise ValueError("rate must be between 0 and 1")
        if count is not None and count < 1:
            raise ValueError("next must be at least 1")
        if delay is not None and delay < 0:
            raise ValueError("a delay cannot be negative")
        default_delay = STALL_SECONDS if kind == "stall" else 0.0
        rule = FaultRule(
            kind=kind,
            rate=rate,
            remaining=count,
            delay=default_delay if delay is None else delay,
        )
        self.rules.append(rule)
        return rule

    def draw(self) -> FaultRule | None:
        """Decide the fault of one read: the first rule that fires, or None."""
        for rule in list(self.rules):
            if rule.remaining is not None:
                rule.remaining -= 1
                if rule.remaining <= 0:
                    self.rules.remove(rule)
                return replace(rule)
            if rule.rate is not None and self._rng.random() < rule.rate:
                return replace(rule)
        return None


class DropResponse(Response):
    """Starts a 200 answer, sends a fragment of the body, then drops the connection."""

    fragment = b'{"id": "chg_'

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the status line and a fragment, then raise `SimulatedDrop`."""
        headers = [
            ("content-type", "application/json"),
            # Declares more than is sent, so a client notices the body is incomplete.
            ("content-length", str(DROP_DECLARED_LENGTH)),
        ]
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            }
        )
        await send({"type": "http.response.body", "body": self.fragment, "more_body": True})
        raise SimulatedDrop(200, headers, self.fragment)


def error_response(kind: FaultKind, headers: list[tuple[str, str]]) -> Response:
    """The answer of a 5xx fault: a JSON 500, an HTML 502 from a gateway, a plain-text 503."""
    response: Response
    if kind == "500":
        response = Response(
            b'{"message": "Internal Server Error"}', 500, media_type="application/json"
        )
    elif kind == "502":
        html = b"<html><head><title>502 Bad Gateway</title></head><body>Bad Gateway</body></html>"
        response = Response(html, 502, media_type="text/html")
    elif kind == "503":
        response = Response(b"Service Unavailable", 503, media_type="text/plain")
    else:
        raise ValueError(f"{kind!r} is not an error fault")
    return with_headers(response, headers)
