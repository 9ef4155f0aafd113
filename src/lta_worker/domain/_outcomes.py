"""What a read can come to: the `Answer` from the wire, and `classify`, its one parser into an
`Outcome` (spec sections 4.4, 4.5, 5 and 7; DESIGN.md, *Rules from the spec*).

Only the spec's three codes and the OAuth codes (`ALLOWED_CODES`) are ever kept, stored or
shown, and `reason` is built from fixed words: a body can echo a credential.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, get_args

from lta_worker.protocol import ERROR_CODES, INACTIVE, NOT_LINKED, REVOKED, TOKEN_PREFIX, Endpoint

# `undecryptable` is no answer: the stored token could not be decrypted (tampered or copied
# row), so nothing was sent; its row in the policy's table keeps the user and re-checks it.
# fmt: off
OutcomeKind = Literal[
    "ok", "none", "revoked", "unlinked", "inactive", "scope_denied", "rejected", "rate_limited",
    "transient", "undecryptable",
]
# fmt: on
OUTCOME_KINDS: tuple[OutcomeKind, ...] = get_args(OutcomeKind)
# The reads the service answered for the client, whatever it said of the user: what health
# and the last success count as reads that succeeded (the policy's `authenticated` rows;
# a test checks they agree).
ANSWERED_KINDS: frozenset[OutcomeKind] = frozenset(
    {"ok", "none", "scope_denied", "revoked", "unlinked", "inactive"}
)
# The reads that failed: 5xx, network, broken body (the user is backed off).
FAILED_KINDS: frozenset[OutcomeKind] = frozenset({"transient"})


def answered_reads(counts: Mapping[str, int], stopped: str = "completed") -> int:
    """How many of the reads counted by outcome kind the service answered, in a pass that
    `stopped` so: none in a pass stopped by the circuit breaker, which read nothing (its
    answers, 404s say, only showed the client or its URLs wrong) and wrote nothing."""
    if stopped == "breaker":
        return 0
    return sum(counts.get(kind, 0) for kind in ANSWERED_KINDS)


@dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP exchange as the API client saw it, before any interpretation.

    `status` None: no response (`error` says why: `timeout`, `connect`, ...); with a status,
    `error` `decoding`: a content-coded body, never decoded, left empty. `truncated`: the body
    was cut at the configured size; `echoed`: a success body holds a credential (`echoes`).
    """

    status: int | None
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str | None = None
    truncated: bool = False
    elapsed: float = 0.0
    echoed: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """A classified answer.

    `payload` (`ok`) with `content`, its canonical JSON serialised once; `code`, one of
    `ALLOWED_CODES`; `reason`, fixed words fit for a log; `at`, when the answer came (each
    stored result carries its own read's time; None: the decision's).
    """

    kind: OutcomeKind
    status: int | None = None
    payload: Any = None
    code: str | None = None
    wait: float | None = None
    reason: str | None = None
    content: bytes | None = None
    at: datetime | None = None

    def canonical(self) -> bytes:
        """`content`, or the payload's canonical JSON when the outcome was built without it."""
        return self.content if self.content is not None else canonical_json(self.payload)


def canonical_json(payload: Any) -> bytes:
    """The canonical JSON form of a payload: sorted keys, no whitespace, UTF-8."""
    text = json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


KNOWN_CODES: Final[Mapping[str, str]] = {
    re.sub(r"[^a-z]", "", code.lower()): code for code in ERROR_CODES
}
# Error codes of OAuth 2.0 (RFC 6749 4.1.2.1 and 5.2), bearer tokens (RFC 6750 3.1) and
# token revocation (RFC 7009 2.2.1): fixed words, safe to keep and show.
# fmt: off
OAUTH_CODES: Final = frozenset({
    "invalid_request", "invalid_client", "invalid_grant", "invalid_scope", "invalid_token",
    "insufficient_scope", "unauthorized_client", "unsupported_grant_type",
    "unsupported_response_type", "unsupported_token_type", "access_denied", "server_error",
    "temporarily_unavailable",
})
# fmt: on
ALLOWED_CODES: Final = frozenset(ERROR_CODES) | OAUTH_CODES

# Fields that may hold a code, in the order they are trusted (the body's format is not
# specified: JSON fields, nested, RFC 7807 `type`, `WWW-Authenticate`, or a plain body).
_CODE_KEYS: Final = ("error", "code", "errorcode", "error_code", "type", "title")
_NESTED_KEYS: Final = ("errors", "error", "detail", "details")
_MAX_DEPTH: Final = 4
_MAX_ITEMS: Final = 8
_MAX_PLAIN: Final = 64
_SAFE_ERROR: Final = re.compile(r"[a-z][a-z_-]{0,23}")
_AUTH_ERROR: Final = re.compile(
    r'(?:^|[\s,])error\s*=\s*(?:"([^"]{0,200})"|([^\s,"]{1,200}))', re.I
)


def classify(endpoint: Endpoint, answer: Answer) -> Outcome:
    """Classify one answer to a read of `endpoint`; never raises; `code` is in `ALLOWED_CODES`."""
    status = answer.status
    if status is None:
        kind = answer.error if answer.error and _SAFE_ERROR.fullmatch(answer.error) else None
        if kind == "tls":  # a certificate or handshake failure: not the network's fault
            return Outcome("transient", reason="tls")
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
    if status == 404 and endpoint == "latest-change":
        # Spec 4.4: nothing recorded for the user, the access is fine.
        return Outcome("none", status=status)
    if status == 404:
        # Not in the spec for stats: unexpected (likely a wrong `service.base_url`), so it
        # never becomes `none` nor replaces a stored result; handled like a transient
        # failure. A pass that sees only 404s stops like the breaker (engine).
        return Outcome("transient", status=status, code=code, reason="unexpected http 404")
    if status == 429:
        # How long to wait is the pacing layer's to say (`pacing.wait_after_429`).
        return Outcome("rate_limited", status=status, code=raw)
    return Outcome("transient", status=status, code=code, reason=_transient_reason(status))


def find_code(headers: Mapping[str, str], body: bytes) -> tuple[str | None, str | None]:
    """The service's error code in an error answer, the one error-body parser: (known, raw).

    `known` is one of the spec's three codes or None (a generic word such as `unauthorized`
    is never taken for one); `raw` is that code, else the first OAuth error code found
    (`OAUTH_CODES`), else None: never free text from the body.
    """
    raw: str | None = None
    with contextlib.suppress(Exception):  # a hostile body must never break a pass
        for candidate, structured in _candidates(headers, body):
            canonical = KNOWN_CODES.get(re.sub(r"[^a-z]", "", candidate.lower()))
            if canonical is not None:
                return canonical, canonical
            oauth = candidate.strip().lower()
            if raw is None and structured and oauth in OAUTH_CODES:
                raw = oauth
    return None, raw


def _success(answer: Answer) -> Outcome:
    if answer.truncated:
        return Outcome("transient", status=answer.status, reason="oversized body")
    parsed = strict_json(answer.body)
    if parsed is None:
        return Outcome("transient", status=answer.status, reason="broken body")
    if answer.echoed:  # the API client found a credential in it (`echoes`)
        return Outcome("transient", status=answer.status, reason="credential echoed")
    payload, content = parsed
    return Outcome("ok", status=answer.status, payload=payload, content=content)


def echoes(body: bytes, secrets: Iterable[bytes]) -> bool:
    """True when a success body holds a credential: one of `secrets` or any string of the
    tokens' shape (`dspa_` and a token character), whoever's; the API client asks this of
    every success (`Answer.echoed`), so that no echoed credential is stored in clear.

    A payload is stored as parsed, so a body with a backslash is checked parsed too
    (`\\u0064spa_...`).
    """
    secrets = tuple(secrets)
    if _CREDENTIAL_SHAPE.search(body) or any(secret in body for secret in secrets):
        return True
    if b"\\" not in body:
        return False
    parsed = strict_json(body)
    if parsed is None:  # not JSON: a broken body, never stored
        return False
    content = parsed[1]
    return bool(_CREDENTIAL_SHAPE.search(content)) or any(secret in content for secret in secrets)


# After the prefix, a visible ASCII character (what a header can carry) other than a quote or a
# backslash: the prefix alone, as a word in a text, is no credential, and an escaped character
# is looked for in the parsed form.
_CREDENTIAL_SHAPE: Final = re.compile(re.escape(TOKEN_PREFIX.encode()) + rb"[!#-\[\]-~]")


def strict_json(body: bytes) -> tuple[Any, bytes] | None:
    """`body` parsed as strict JSON (RFC 8259), with its canonical form; None when it is not.

    Refused: `NaN`, `Infinity`, `1e999`, non-UTF-8 (`json.loads` would take UTF-16 from
    bytes), and what cannot be written back as UTF-8 JSON (a lone surrogate): every stored
    payload can be exported again. A UTF-8 byte order mark is ignored, as the RFC allows.
    """
    try:
        text = body.decode("utf-8").removeprefix("\ufeff")
        payload = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
        return payload, canonical_json(payload)
    except (ValueError, RecursionError, UnicodeError):
        return None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number too large for a float")
    return value


def _transient_reason(status: int) -> str:
    if status == 408 or 500 <= status < 600:
        return f"http {status}"
    if 100 <= status < 600:
        return f"unexpected http {status}"
    return "invalid status"


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
