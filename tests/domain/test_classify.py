"""The classifier: one test per row of spec section 7, error codes in every body style."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lta_worker.domain import OUTCOME_KINDS, Answer, Endpoint, Outcome, classify, echoes, find_code
from lta_worker.domain._outcomes import ALLOWED_CODES, strict_json
from lta_worker.pacing import wait_after_429
from lta_worker.pacing._window import DEFAULT_MAX_WAIT, FALLBACK_429_WAIT

LATEST: Endpoint = "latest-change"
STATS: Endpoint = "stats"
NOW = datetime(2025, 1, 1, tzinfo=UTC)
SECRET = "dspa_S3cretT0kenValue0123456789.cl1ent-s3cret"
TOKEN, SCOPE = "invalid_token", "insufficient_scope"
REVOKED, UNLINKED, INACTIVE = "PermanentAccessRevoked", "NoCloudSyncLinked", "CloudSyncInactive"


def answer(status: int | None, body: Any = b"", **kwargs: Any) -> Answer:
    """An answer; a non-bytes body is sent as JSON."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Answer(status=status, body=raw, **kwargs)


def coded(status: int, code: str) -> Answer:
    """An answer whose JSON body names `code` as its error."""
    return answer(status, {"error": code})


@pytest.mark.parametrize(
    ("endpoint", "given_answer", "kind", "code"),
    [
        pytest.param(LATEST, answer(200, {"at": 1}), "ok", None, id="200-json"),
        pytest.param(STATS, answer(200, [1, 2]), "ok", None, id="200-json-list"),
        pytest.param(LATEST, answer(404), "none", None, id="404-latest-change"),
        pytest.param(STATS, answer(404), "transient", None, id="404-stats-unexpected"),
        pytest.param(LATEST, answer(204), "none", None, id="204-no-content"),
        pytest.param(LATEST, coded(401, REVOKED), "revoked", REVOKED, id="401-revoked"),
        pytest.param(STATS, coded(401, UNLINKED), "unlinked", UNLINKED, id="401-unlinked"),
        pytest.param(LATEST, answer(401), "rejected", None, id="401-plain"),
        pytest.param(LATEST, coded(401, TOKEN), "rejected", TOKEN, id="401-unknown-code"),
        pytest.param(LATEST, coded(401, INACTIVE), "rejected", INACTIVE, id="401-code-of-403"),
        pytest.param(STATS, coded(403, INACTIVE), "inactive", INACTIVE, id="403-inactive"),
        pytest.param(STATS, answer(403), "scope_denied", None, id="403-plain"),
        pytest.param(STATS, coded(403, SCOPE), "scope_denied", SCOPE, id="403-other-code"),
        pytest.param(STATS, coded(403, REVOKED), "scope_denied", REVOKED, id="403-never-deletes"),
        pytest.param(LATEST, answer(429), "rate_limited", None, id="429"),
        pytest.param(LATEST, answer(500), "transient", None, id="500"),
        pytest.param(LATEST, answer(503), "transient", None, id="503"),
        pytest.param(LATEST, answer(408), "transient", None, id="408"),
        pytest.param(LATEST, answer(418), "transient", None, id="other-4xx"),
        pytest.param(LATEST, answer(302), "transient", None, id="redirect"),
        pytest.param(LATEST, answer(None, error="timeout"), "transient", None, id="network"),
    ],
)
def test_spec_rows(endpoint: Endpoint, given_answer: Answer, kind: str, code: str | None) -> None:
    """Each status and code of spec section 7 maps to its outcome kind and code."""
    outcome = classify(endpoint, given_answer)
    assert (outcome.kind, outcome.code) == (kind, code)
    assert outcome.status == given_answer.status


def test_ok_keeps_the_payload_as_parsed() -> None:
    """A 2xx JSON body becomes the payload, unchanged and opaque."""
    payload = {"nested": {"list": [1, 2.5, None, "x"]}, "unicode": "é"}
    assert classify(LATEST, answer(200, payload)).payload == payload


@pytest.mark.parametrize(
    ("given_answer", "reason"),
    [
        pytest.param(answer(200, b""), "broken body", id="empty"),
        pytest.param(answer(200, b"{not json"), "broken body", id="broken"),
        pytest.param(answer(200, b"<html>hi</html>"), "broken body", id="html"),
        pytest.param(answer(200, b"\xff\xfe\x00"), "broken body", id="not-utf8"),
        pytest.param(answer(200, b'{"a": 1}', truncated=True), "oversized body", id="truncated"),
        pytest.param(answer(503), "http 503", id="5xx"),
        pytest.param(answer(408), "http 408", id="408"),
        pytest.param(answer(418), "unexpected http 418", id="418"),
        pytest.param(answer(None, error="connect"), "network connect", id="network"),
        pytest.param(answer(None, error=SECRET), "network error", id="network-odd-error"),
        pytest.param(answer(None), "network error", id="network-no-detail"),
        pytest.param(answer(None, error="tls"), "tls", id="tls-own-reason"),
    ],
)
def test_transient_reasons(given_answer: Answer, reason: str) -> None:
    """Transient outcomes carry a fixed, secret-free reason."""
    outcome = classify(LATEST, given_answer)
    assert (outcome.kind, outcome.reason) == ("transient", reason)


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        pytest.param({"error": REVOKED, "message": "gone"}, {}, id="json-error"),
        pytest.param({"code": REVOKED}, {}, id="json-code"),
        pytest.param({"errorCode": REVOKED}, {}, id="json-errorCode"),
        pytest.param({"error_code": REVOKED}, {}, id="json-error_code"),
        pytest.param({"error": {"code": REVOKED}}, {}, id="nested-object"),
        pytest.param({"errors": [{"code": REVOKED, "message": "m"}]}, {}, id="errors-list"),
        pytest.param({"errors": [{"code": "other"}, {"code": REVOKED}]}, {}, id="second-item"),
        pytest.param(
            {"type": f"https://api.example/problems/{REVOKED}", "title": REVOKED},
            {},
            id="rfc7807-type",
        ),
        pytest.param({"type": "urn:problem:permanent-access-revoked"}, {}, id="urn-kebab"),
        pytest.param({"title": "Permanent access revoked"}, {}, id="title-words"),
        pytest.param(b"", {"www-authenticate": f'Bearer realm="api", error="{REVOKED}"'}, id="hdr"),
        pytest.param(b"", {"WWW-Authenticate": f"Bearer error={REVOKED}"}, id="header-bare"),
        pytest.param(REVOKED.encode(), {}, id="plain-text"),
        pytest.param(b'"PermanentAccessRevoked"\n', {}, id="json-string"),
        pytest.param({"error": "permanent_access_revoked"}, {}, id="snake"),
        pytest.param({"error": "PERMANENT-ACCESS-REVOKED"}, {}, id="kebab-upper"),
        pytest.param({"ERROR": "permanentaccessrevoked"}, {}, id="key-case"),
    ],
)
def test_revoked_code_found_wherever_it_is(body: Any, headers: dict[str, str]) -> None:
    """PermanentAccessRevoked is recognised in every body style and spelling."""
    outcome = classify(LATEST, answer(401, body, headers=headers))
    assert (outcome.kind, outcome.code) == ("revoked", REVOKED)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"message": "Unauthorized"}, id="message"),
        pytest.param({"error": "unauthorized"}, id="generic-error-word"),
        pytest.param({"type": "about:blank", "title": "Unauthorized"}, id="problem-blank"),
        pytest.param({"error": "PermanentAccessRevokedSoon"}, id="longer-word"),
        pytest.param({"detail": "PermanentAccessRevoked"}, id="detail-is-prose"),
        pytest.param({"error": ["not", "a", "code"]}, id="list-of-words"),
        pytest.param(b"Unauthorized", id="plain-word"),
        pytest.param(b"x" * 5000 + b"PermanentAccessRevoked", id="long-plain"),
    ],
)
def test_generic_words_are_not_codes(body: Any) -> None:
    """A plain 401 in any shape stays `rejected`: only known codes revoke."""
    assert classify(LATEST, answer(401, body)).kind == "rejected"


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        pytest.param({"ratelimit": '"p";r=0;t=90'}, 90.0, id="draft-reset"),
        pytest.param({"ratelimit": '"p";r=0;t=90', "retry-after": "5"}, 5.0, id="retry-wins"),
        pytest.param({"x-ratelimit-reset": str(int(NOW.timestamp()) + 33)}, 33.0, id="x-epoch"),
        pytest.param({}, FALLBACK_429_WAIT, id="fallback"),
        pytest.param({"retry-after": "99999999"}, DEFAULT_MAX_WAIT, id="at-most-max-wait"),
        pytest.param(
            {"retry-after": "7200", "ratelimit-policy": '"p";q=100;w=600', "ratelimit": '"p";r=0'},
            601.0,
            id="at-most-the-window",
        ),
        pytest.param({"ratelimit": '"p";r=0;t=999999999'}, DEFAULT_MAX_WAIT, id="31-years"),
        pytest.param({"x-ratelimit-reset": "999999999999"}, DEFAULT_MAX_WAIT, id="epoch-far"),
    ],
)
def test_rate_limited_wait(headers: dict[str, str], wait: float) -> None:
    """A 429's wait comes from Retry-After, else the reset, else a sane fallback."""
    outcome = classify(LATEST, answer(429, headers=headers))
    assert (outcome.kind, wait_after_429(headers, NOW)) == ("rate_limited", wait)


def test_rate_limited_wait_measured_against_the_answers_date() -> None:
    """An HTTP-date Retry-After is measured against the answer's Date when believable."""
    headers = {
        "date": format_datetime(NOW, usegmt=True),
        "retry-after": format_datetime(NOW + timedelta(seconds=25), usegmt=True),
    }
    assert wait_after_429(headers, NOW + timedelta(seconds=3)) == 25.0


def test_raw_code_kept_only_when_on_the_allowlist() -> None:
    """Unknown codes are kept only when they are OAuth error codes of the allowlist."""
    assert find_code({}, json.dumps({"error": "invalid_token"}).encode()) == (None, "invalid_token")
    assert find_code({}, json.dumps({"error": "has spaces in it"}).encode()) == (None, None)
    assert find_code({}, json.dumps({"error": "a" * 80}).encode()) == (None, None)
    assert find_code({}, json.dumps({"code": "k8Hq2x9Z7mP3vB6n"}).encode()) == (None, None)
    assert find_code({}, json.dumps({"error": SECRET}).encode()) == (None, None)
    assert find_code({}, b"invalid_token") == (None, None)  # plain text: known codes only


@pytest.mark.parametrize(
    ("status", "body", "headers"),
    [
        pytest.param(500, {"error": "s3cr3tClientValue"}, {}, id="500-echoed-secret"),
        pytest.param(401, {"error": "MyClientSecret"}, {}, id="401-word-like-secret"),
        pytest.param(403, {"code": "MissingScope"}, {}, id="403-undocumented-code"),
        pytest.param(429, {"error": "slow_down_now"}, {}, id="429-free-text"),
        pytest.param(
            401, b"", {"www-authenticate": 'Bearer error="hunter2secret"'}, id="www-authenticate"
        ),
        pytest.param(503, {"errors": [{"code": "AbCdEf"}]}, {}, id="nested-free-text"),
    ],
)
def test_free_text_of_a_body_is_never_a_code(status: int, body: Any, headers: Any) -> None:
    """Only the spec's codes and the OAuth allowlist become `code`; anything else is None."""
    outcome = classify(STATS, answer(status, body, headers=headers))
    assert outcome.code is None


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"n": 1e999}', id="1e999-is-inf"),
        pytest.param(b'{"n": -1e400}', id="minus-inf"),
        pytest.param(b'{"n": NaN}', id="nan"),
        pytest.param(b'{"n": Infinity}', id="infinity"),
        pytest.param(b"[-Infinity]", id="minus-infinity"),
        pytest.param(b'{"s": "\\ud800"}', id="lone-surrogate"),
        pytest.param(b"[" * 5000 + b"]" * 5000, id="too-deep"),
        pytest.param('{"n": 1}'.encode("utf-16"), id="utf-16"),
        pytest.param('{"n": 1}'.encode("utf-16-be"), id="utf-16-be-no-bom"),
        pytest.param('{"n": 1}'.encode("utf-32"), id="utf-32"),
        pytest.param(b'{"s": "\xed\xa0\x80"}', id="utf-8-encoded-surrogate"),
    ],
)
def test_payload_that_is_not_strict_json_is_a_broken_body(body: bytes) -> None:
    """RFC 8259: NaN, Infinity, 1e999, bad strings and non-UTF-8 text make a broken body."""
    outcome = classify(LATEST, Answer(status=200, body=body))
    assert (outcome.kind, outcome.reason, outcome.payload) == ("transient", "broken body", None)


def test_a_utf8_byte_order_mark_is_ignored() -> None:
    """RFC 8259 lets a parser ignore a UTF-8 byte order mark: the payload is read as is."""
    outcome = classify(LATEST, Answer(status=200, body=b'\xef\xbb\xbf{"n": 1}'))
    assert (outcome.kind, outcome.payload) == ("ok", {"n": 1})


statuses = st.one_of(st.none(), st.integers(min_value=-1000, max_value=10_000))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["error", "code", "errors", "type", "title", "detail", "x"]),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)
bodies = st.one_of(
    st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode("utf-8"))
)
header_maps = st.dictionaries(
    st.sampled_from(["www-authenticate", "retry-after", "ratelimit", "date", "x-ratelimit-reset"]),
    st.text(max_size=60),
    max_size=4,
)


answers = st.builds(
    Answer,
    status=statuses,
    headers=header_maps,
    body=bodies,
    error=st.one_of(st.none(), st.text(max_size=20)),
    truncated=st.booleans(),
)


@given(endpoint=st.sampled_from([LATEST, STATS]), given_answer=answers)
def test_arbitrary_answers_never_raise(endpoint: Endpoint, given_answer: Answer) -> None:
    """Any status, headers and body classify to some outcome without raising."""
    outcome = classify(endpoint, given_answer)
    assert isinstance(outcome, Outcome)
    assert outcome.kind in OUTCOME_KINDS
    if outcome.kind == "rate_limited":
        assert 1.0 <= wait_after_429(given_answer.headers, NOW) <= DEFAULT_MAX_WAIT
    assert outcome.code is None or outcome.code in ALLOWED_CODES
    if outcome.kind == "ok":  # a stored payload can always be written back as strict JSON
        json.dumps(outcome.payload, allow_nan=False, ensure_ascii=False).encode("utf-8")


@given(
    status=st.sampled_from([200, 400, 401, 403, 404, 429, 500, 503]),
    shape=st.sampled_from(["error", "code", "title", "type", "nested", "plain", "header"]),
    filler=st.text(alphabet="abcdefXYZ0123456789_-.", min_size=8, max_size=30),
)
def test_secret_in_a_body_never_reaches_reason_or_code(
    status: int, shape: str, filler: str
) -> None:
    """A credential echoed anywhere in an answer never appears in `reason` or `code`."""
    secret = f"dspa_{filler}"
    body: Any = {
        "error": {"error": secret},
        "code": {"code": secret, "message": secret},
        "title": {"title": secret, "detail": secret},
        "type": {"type": f"https://x.example/{secret}"},
        "nested": {"errors": [{"code": secret}]},
        "plain": secret.encode(),
        "header": b"",
    }[shape]
    headers = {"www-authenticate": f'Bearer error="{secret}"'} if shape == "header" else {}
    outcome = classify(STATS, answer(status, body, headers=headers))
    for field in (outcome.reason, outcome.code):
        assert field is None or filler not in field


@pytest.mark.parametrize(
    ("body", "echoed"),
    [
        pytest.param(b'{"t": "dspa_other.user"}', True, id="another-users-token"),
        pytest.param(b'{"m": "token dspa_x9 leaked"}', True, id="in-free-text"),
        pytest.param(b'{"t": "\\u0064spa_x9"}', True, id="prefix-escaped"),
        pytest.param(b'{"t": "dspa_\\u0078"}', True, id="first-character-escaped"),
        pytest.param(b'{"t": "dspa_"}', False, id="the-prefix-alone"),
        pytest.param(b'{"t": "the dspa_ prefix"}', False, id="the-prefix-as-a-word"),
        pytest.param(b'{"t": "DSPA_x9"}', False, id="another-case"),
        pytest.param(b'{"n": 1}', False, id="plain-payload"),
    ],
)
def test_any_credential_shaped_token_in_a_success_body_is_an_echo(
    body: bytes, echoed: bool
) -> None:
    """A `dspa_` token of anyone (the prefix then a token character) counts as an echo."""
    assert strict_json(body) is not None
    assert echoes(body, ()) is echoed
