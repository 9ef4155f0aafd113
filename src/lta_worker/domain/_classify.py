"""Classify one answer of a read into an `Outcome` (pure; spec sections 4.4, 4.5, 5 and 7).

| status | code                     | outcome                    |
|--------|--------------------------|----------------------------|
| 2xx    | JSON body                | ok (payload as parsed)     |
| 2xx    | empty/broken/truncated   | transient                  |
| 2xx    | echoing a credential     | transient                  |
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
`unauthorized` is never taken for one. `find_code` is the one error-body parser (the API
client uses it for enrollment too), and `ALLOWED_CODES` the one list of codes that may ever
be kept, stored (`last_code`) or shown: the spec's three, and the OAuth and bearer-token
error codes of RFC 6749, 6750 and 7009. Anything else in a body is dropped, since a body can
echo a credential. `reason` is built from fixed words only, for the same reason.

A 2xx payload must be strict JSON (RFC 8259): `NaN`, `Infinity` and numbers too large for
a float (`1e999`) are refused, as is a string that cannot be written back as UTF-8 (a lone
surrogate), so that every stored payload can be stored and exported as JSON again; such a
body is a broken body (transient).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from lta_worker.domain._model import Endpoint
from lta_worker.domain._outcomes import Answer, Outcome, canonical_json
from lta_worker.protocol import ERROR_CODES, INACTIVE, NOT_LINKED, REVOKED, TOKEN_PREFIX

KNOWN_CODES: Final[Mapping[str, str]] = {
    re.sub(r"[^a-z]", "", code.lower()): code for code in ERROR_CODES
}
# Error codes of OAuth 2.0 (RFC 6749 4.1.2.1 and 5.2), bearer tokens (RFC 6750 3.1) and
# token revocation (RFC 7009 2.2.1): fixed words, safe to keep and show.
OAUTH_CODES: Final = frozenset(
    {
        "invalid_request",
        "invalid_client",
        "invalid_grant",
        "invalid_scope",
        "invalid_token",
        "insufficient_scope",
        "unauthorized_client",
        "unsupported_grant_type",
        "unsupported_response_type",
        "unsupported_token_type",
        "access_denied",
        "server_error",
        "temporarily_unavailable",
    }
)
ALLOWED_CODES: Final = frozenset(ERROR_CODES) | OAUTH_CODES

# Fields that may hold a code, in the order they are trusted.
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
    """Turn one answer into an outcome; never raises, whatever the body or headers hold.

    Args:
        endpoint: Which read was made.
        answer: The answer as the API client saw it.

    Returns:
        The outcome; `code` is None or one of `ALLOWED_CODES`.
    """
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
    """Find the service's error code in an error answer.

    Args:
        headers: Response headers (lower-case names; other cases are looked up too).
        body: The (possibly capped) response body, in any format or none.

    Returns:
        (known, raw): `known` is the canonical name of a recognised code
        (`PermanentAccessRevoked`, `NoCloudSyncLinked`, `CloudSyncInactive`) or None; `raw`
        is that code, else the first OAuth error code found (`OAUTH_CODES`), else None:
        never free text from the body.
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
    """True when a success body holds a credential: one of `secrets` (the user's token, the
    client secret) or any credential-shaped string, the long term tokens' prefix (`dspa_`)
    followed by a character a token may hold, whoever's token it is (another user's).

    A payload is stored as parsed, so a credential written with JSON escapes
    (`\\u0064spa_...`) counts too: a body with a backslash is also checked in its parsed
    form (the payload's canonical JSON, escapes undone). A service that echoes a credential
    must not put it in the database in clear. The API client asks this of every success
    (`Answer.echoed`), since only it holds the credential.
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
    """`body` parsed as strict JSON (RFC 8259), with its canonical form (`canonical_json`);
    None when it is not.

    Refused: `NaN`, `Infinity`, numbers beyond a float (`1e999`), a text that is not UTF-8
    (`json.loads` would take UTF-16 and UTF-32 from bytes), and anything that cannot be
    written back as JSON in UTF-8 (a lone surrogate, nesting too deep to serialise): the
    canonical form is that check. A UTF-8 byte order mark is ignored, as the RFC allows.
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
    if status == 404:
        return "unexpected http 404"
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
