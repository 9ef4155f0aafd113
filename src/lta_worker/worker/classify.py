"""Classify one answer of a read into an `Outcome` (pure; spec sections 4.4, 4.5, 5 and 7).

| status | code                     | outcome                    |
|--------|--------------------------|----------------------------|
| 2xx    | JSON body                | ok (payload as parsed)     |
| 2xx    | empty/broken/truncated   | transient                  |
| 401    | PermanentAccessRevoked   | revoked (delete the token) |
| 401    | NoCloudSyncLinked        | unlinked                   |
| 401    | none or unknown          | rejected (never revoked)   |
| 403    | CloudSyncInactive        | inactive                   |
| 403    | none or another          | scope_denied               |
| 404    | latest-change            | none                       |
| 404    | stats                    | transient (unexpected)     |
| 429    | -                        | rate_limited (wait)        |
| other  | -                        | transient (network, 408, 5xx, other 4xx, 3xx) |

The error body's format is not specified, so the code is looked for wherever services put
one (JSON fields, nested objects and lists, RFC 7807 type URIs, `WWW-Authenticate`, a plain
text body), and only the three known codes are recognised, so a generic word such as
`unauthorized` is never taken for one. `reason` is built from fixed words only: a body can
echo a credential, so no body text reaches it.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any, Final

from lta_worker.storage.records import Endpoint
from lta_worker.worker.outcomes import Answer, Outcome
from lta_worker.worker.ratelimit import parse_ratelimit, response_time

REVOKED: Final = "PermanentAccessRevoked"
NOT_LINKED: Final = "NoCloudSyncLinked"
INACTIVE: Final = "CloudSyncInactive"
KNOWN_CODES: Final[Mapping[str, str]] = {
    re.sub(r"[^a-z]", "", code.lower()): code for code in (REVOKED, NOT_LINKED, INACTIVE)
}
# Seconds to wait after a 429 that says nothing usable about when to come back.
RATE_LIMIT_FALLBACK_WAIT: Final = 60.0
RATE_LIMIT_MIN_WAIT: Final = 1.0
RATE_LIMIT_MAX_WAIT: Final = 86_400.0

# Fields that may hold a code, in the order they are trusted.
_CODE_KEYS: Final = ("error", "code", "errorcode", "error_code", "type", "title")
_NESTED_KEYS: Final = ("errors", "error", "detail", "details")
_MAX_DEPTH: Final = 4
_MAX_ITEMS: Final = 8
_MAX_PLAIN: Final = 64
# A code worth keeping for logs: short, word-like, few digits (a secret is rarely that).
_SAFE_CODE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,39}")
_MAX_CODE_DIGITS: Final = 4
_SAFE_ERROR: Final = re.compile(r"[a-z][a-z_-]{0,23}")
_AUTH_ERROR: Final = re.compile(
    r'(?:^|[\s,])error\s*=\s*(?:"([^"]{0,200})"|([^\s,"]{1,200}))', re.I
)


def classify(endpoint: Endpoint, answer: Answer, *, now: datetime | None = None) -> Outcome:
    """Turn one answer into an outcome; never raises, whatever the body or headers hold.

    Args:
        endpoint: Which read was made.
        answer: The answer as the API client saw it.
        now: When it arrived; used only to read an HTTP-date `Retry-After` or an epoch
            reset of a 429 when the answer carries no `Date` of its own.

    Returns:
        The outcome; `code` is a known code, or a short token-like raw code for logs.
    """
    status = answer.status
    if status is None:
        kind = answer.error if answer.error and _SAFE_ERROR.fullmatch(answer.error) else None
        return Outcome("transient", reason=f"network {kind}" if kind else "network error")
    if status == 204:
        # No content: nothing to store, and nothing wrong with the access.
        return Outcome("none", status=status)
    if 200 <= status < 300:
        return _success(answer)
    known, raw = find_code(answer.headers, answer.body)
    code = known or raw
    if status == 401:
        if known == REVOKED:
            return Outcome("revoked", status=status, code=known)
        if known == NOT_LINKED:
            return Outcome("unlinked", status=status, code=known)
        # Spec 5.7: a plain 401 is not a revocation, and an unknown code is no better.
        return Outcome("rejected", status=status, code=raw, reason="401 without a known code")
    if status == 403:
        if known == INACTIVE:
            return Outcome("inactive", status=status, code=known)
        # Spec 7 documents 403 without a code as "scope not granted". Another code is not
        # documented; treating it the same way is the safe reading: only this endpoint is
        # skipped (for parked_interval), the token and the other endpoint are kept, and no
        # retry sooner could change a refusal.
        return Outcome("scope_denied", status=status, code=raw)
    if status == 404:
        # Spec 4.4: nothing recorded for the user, the access is fine. The spec names it for
        # latest-change only; on stats it can mean nothing else, and retrying sooner (as a
        # transient failure would) only spends budget.
        return Outcome("none", status=status)
    if status == 429:
        return Outcome("rate_limited", status=status, code=raw, wait=_wait(answer, now))
    return Outcome("transient", status=status, code=code, reason=_transient_reason(status))


def find_code(headers: Mapping[str, str], body: bytes) -> tuple[str | None, str | None]:
    """Find the service's error code in an error answer.

    Args:
        headers: Response headers (lower-case names; other cases are looked up too).
        body: The (possibly capped) response body, in any format or none.

    Returns:
        (known, raw): `known` is the canonical name of a recognised code
        (`PermanentAccessRevoked`, `NoCloudSyncLinked`, `CloudSyncInactive`) or None; `raw`
        is the first code-like value found when it is short and token-like, for logs.
    """
    raw: str | None = None
    with contextlib.suppress(Exception):  # a hostile body must never break a pass
        for candidate, structured in _candidates(headers, body):
            canonical = KNOWN_CODES.get(re.sub(r"[^a-z]", "", candidate.lower()))
            if canonical is not None:
                return canonical, canonical
            if raw is None and structured and _safe_code(candidate):
                raw = candidate
    return None, raw


def _success(answer: Answer) -> Outcome:
    if answer.truncated:
        return Outcome("transient", status=answer.status, reason="oversized body")
    try:
        payload = json.loads(answer.body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return Outcome("transient", status=answer.status, reason="broken body")
    return Outcome("ok", status=answer.status, payload=payload)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _transient_reason(status: int) -> str:
    if status == 408 or 500 <= status < 600:
        return f"http {status}"
    if status == 404:
        return "unexpected http 404"
    if 100 <= status < 600:
        return f"unexpected http {status}"
    return "invalid status"


def _wait(answer: Answer, now: datetime | None) -> float:
    try:
        info = parse_ratelimit(answer.headers, response_time(answer.headers) or now)
    except Exception:
        info = None
    wait = None if info is None else info.wait
    if wait is None or not math.isfinite(wait):
        wait = RATE_LIMIT_FALLBACK_WAIT
    return min(max(wait, RATE_LIMIT_MIN_WAIT), RATE_LIMIT_MAX_WAIT)


def _candidates(headers: Mapping[str, str], body: bytes) -> Iterator[tuple[str, bool]]:
    """Code-like strings, with whether they came from a structured field."""
    for name, value in headers.items():
        if isinstance(name, str) and name.lower() == "www-authenticate" and isinstance(value, str):
            for quoted, bare in _AUTH_ERROR.findall(value):
                yield quoted or bare, True
    if not body:
        return
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        document = None
    if isinstance(document, dict | list):
        yield from _json_candidates(document, 0)
        return
    plain = document if isinstance(document, str) else text.strip().strip("\"'")
    if len(plain) <= _MAX_PLAIN:
        # A plain body may be anything (even an echoed credential): known codes only.
        yield plain, False


def _json_candidates(node: object, depth: int) -> Iterator[tuple[str, bool]]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(node, list):
        for item in node[:_MAX_ITEMS]:
            yield from _json_candidates(item, depth + 1)
        return
    if not isinstance(node, dict):
        return
    fields = {key.lower(): value for key, value in node.items() if isinstance(key, str)}
    for key in _CODE_KEYS:
        value = fields.get(key)
        if isinstance(value, str) and len(value) <= 2 * _MAX_PLAIN:
            if key == "type":  # RFC 7807: a URI whose last segment names the problem
                if value.strip().lower() == "about:blank":  # RFC 7807's "no type"
                    continue
                value = re.split(r"[/#:]", value.rstrip("/#"))[-1]
            yield value, key != "title"
    for key in _NESTED_KEYS:
        value = fields.get(key)
        if isinstance(value, dict | list):
            yield from _json_candidates(value, depth + 1)


def _safe_code(value: str) -> bool:
    return (
        _SAFE_CODE.fullmatch(value) is not None
        and not value.lower().startswith("dspa")
        and sum(c.isdigit() for c in value) <= _MAX_CODE_DIGITS
    )
