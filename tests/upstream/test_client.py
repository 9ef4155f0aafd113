"""The API client against httpx.MockTransport: URLs, headers, body cap, errors."""

from __future__ import annotations

import json
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import cache
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from lta_worker import __version__
from lta_worker.config import Settings, build_settings
from lta_worker.domain import classify
from lta_worker.errors import ConfigError, EnrollmentError
from lta_worker.logs import scrub
from lta_worker.secret import Secret
from lta_worker.upstream import (
    ApiClient,
    check_secure_url,
    http_client,
    join_url,
    long_term_credential,
)
from support.enroll import basic

pytestmark = pytest.mark.anyio

TOKEN = Secret("dspa_Tok3nValue-0123456789abcdef")
CLIENT_SECRET = Secret("cl1ent-s3cret-value")


def api_for(http: httpx.AsyncClient, settings: Settings) -> ApiClient:
    """The API client over `http` with `settings`' sections and the test's client secret."""
    return ApiClient(http, settings.service, settings.client, CLIENT_SECRET)


USER_TOKEN = Secret("user-access-token-abcdef123456")
CAP = 2048

Handler = Callable[[httpx.Request], Any]


def make_settings(client: dict[str, Any] | None = None, **service: Any) -> Settings:
    """Settings whose URLs have a path prefix and whose body cap is CAP."""
    urls = {
        "base_url": "https://api.example/some/prefix",
        "auth_url": "https://account.example/auth/prefix",
    }
    return build_settings(
        {
            "service": {**urls, "max_response_bytes": CAP, **service},
            "client": {"id": "demo-client", **(client or {})},
        }
    )


def make_api(handler: Handler, settings: Settings | None = None) -> ApiClient:
    settings = settings or make_settings()
    http = http_client(settings.service, transport=httpx.MockTransport(handler))
    return api_for(http, settings)


class Recorder:
    """A MockTransport handler that records requests and answers with a fixed response."""

    def __init__(self, response: Callable[[], httpx.Response] | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self._response = response or (lambda: httpx.Response(200, json={"ok": True}))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return self._response()


def test_join_url_keeps_the_path_prefix() -> None:
    """A base URL's path prefix survives joining (urljoin would drop it), a trailing / too."""
    assert join_url("https://host/some/prefix", "/api/v1/x") == "https://host/some/prefix/api/v1/x"
    assert join_url("https://host/", "/x") == "https://host/x"


@pytest.mark.parametrize(
    ("endpoint", "path"),
    [
        ("latest-change", "/some/prefix/api/v1/history/latest-change"),
        ("stats", "/some/prefix/api/v1/history/stats"),
    ],
)
async def test_read_keeps_the_base_url_prefix(endpoint: Any, path: str) -> None:
    """Reads go to {base_url}/api/v1/history/..., prefix included, the first and every later one."""
    rec = Recorder()
    api = make_api(rec)
    for _ in range(2):
        answer = await api.read(endpoint, TOKEN)
        assert answer.status == 200
    assert [(r.url.host, r.url.path) for r in rec.requests] == [("api.example", path)] * 2


LONG_TERM = f"Bearer {TOKEN.reveal()}.{CLIENT_SECRET.reveal()}"
TOKENS = "/auth/prefix/api/long-term-access/tokens"
STATS = "/some/prefix/api/v1/history/stats"
BEARER = f"Bearer {USER_TOKEN.reveal()}"


@pytest.mark.parametrize(
    ("call", "method", "path", "authorization"),
    [
        pytest.param(lambda api: api.read("stats", TOKEN), "GET", STATS, LONG_TERM, id="read"),
        pytest.param(lambda api: api.drop(TOKEN), "DELETE", TOKENS, LONG_TERM, id="drop"),
        pytest.param(lambda api: api.create_token(USER_TOKEN), "POST", TOKENS, BEARER, id="create"),
    ],
)
async def test_each_call_sends_its_credential_only_in_the_authorization_header(
    call: Callable[[ApiClient], Any], method: str, path: str, authorization: str
) -> None:
    """The credential is in Authorization alone (no client id); identity coding; our name."""
    body = {"token": TOKEN.reveal(), "scopes": ["cloud-sync.permanent.stats"]}
    rec = Recorder(lambda: httpx.Response(200, json=body))
    await call(make_api(rec))
    (request,) = rec.requests
    assert (request.method, request.url.path) == (method, path)
    assert request.headers["authorization"] == authorization
    assert "ds-api-client-id" not in request.headers
    assert request.headers["accept-encoding"] == "identity"  # whatever decoders httpx has
    assert request.headers["user-agent"] == f"lta-worker/{__version__}"
    assert request.content == b""
    others = [v for k, v in request.headers.items() if k != "authorization"]
    for raw in (TOKEN.reveal(), CLIENT_SECRET.reveal(), USER_TOKEN.reveal()):
        assert raw not in str(request.url)
        assert all(raw not in v for v in others)


async def test_answer_headers_are_lower_case() -> None:
    """Header names in an Answer are lower-case."""
    rec = Recorder(
        lambda: httpx.Response(200, headers={"RateLimit-Policy": '"h";q=120;w=3600'}, json={})
    )
    answer = await make_api(rec).read("stats", TOKEN)
    assert answer.headers["ratelimit-policy"] == '"h";q=120;w=3600'
    assert all(name == name.lower() for name in answer.headers)


async def test_endless_body_stops_at_the_cap() -> None:
    """A streamed body that never ends is read only up to the cap."""
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        while True:
            sent += 512
            yield b"z" * 512

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=endless())

    answer = await make_api(handler).read("stats", TOKEN)
    assert answer.truncated
    assert len(answer.body) == CAP
    assert sent <= CAP + 512


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx.ConnectTimeout("t"), "timeout"),
        (httpx.ReadTimeout("t"), "timeout"),
        (httpx.ConnectError("refused"), "connect"),
        (httpx.ReadError("reset"), "reset"),
        (httpx.RemoteProtocolError("bad"), "protocol"),
        (ConnectionResetError("reset"), "reset"),
    ],
)
async def test_network_errors_become_answers(exc: Exception, kind: str) -> None:
    """Timeouts, refused connections, resets and protocol errors of a read or a drop give
    Answer(status=None) with the error's kind."""

    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    api = make_api(handler)
    answer = await api.read("latest-change", TOKEN)
    assert (answer.status, answer.error, answer.body) == (None, kind, b"")
    dropped = await api.drop(TOKEN)
    assert (dropped.status, dropped.error) == (None, kind)


async def test_broken_body_becomes_an_answer() -> None:
    """A connection that breaks in the middle of the body gives status None, headers kept."""

    async def broken() -> AsyncIterator[bytes]:
        yield b'{"partial": '
        raise httpx.ReadError("connection reset")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"RateLimit": '"h";r=5;t=60'}, content=broken())

    answer = await make_api(handler).read("stats", TOKEN)
    assert answer.status is None
    assert answer.error == "reset"
    assert answer.headers.get("ratelimit") == '"h";r=5;t=60'


def test_check_secure_url() -> None:
    """https anywhere and http to loopback pass; http elsewhere is refused."""
    check_secure_url("https://api.example/x")
    check_secure_url("http://127.0.0.1:8080/x")
    check_secure_url("http://localhost/x")
    check_secure_url("http://[::1]/x")
    for url in ("http://api.example/x", "http://10.0.0.1/x", "ftp://api.example/x"):
        with pytest.raises(ConfigError):
            check_secure_url(url)


async def test_api_client_refuses_http_to_a_remote_host() -> None:
    """Even when settings were bypassed, no request goes over http to a non-loopback host."""
    rec = Recorder()
    good = make_settings()
    bad = replace(good, service=replace(good.service, base_url="http://api.example"))
    http = httpx.AsyncClient(transport=httpx.MockTransport(rec))
    api = api_for(http, bad)
    for _ in range(2):  # the second read too (its URL is parsed once)
        with pytest.raises(ConfigError, match="only https"):
            await api.read("stats", TOKEN)
    assert rec.requests == []


async def test_http_client_hook_refuses_http_to_a_remote_host() -> None:
    """The wired client's request hook refuses plain http to a remote host on its own."""
    rec = Recorder()
    async with http_client(make_settings().service, transport=httpx.MockTransport(rec)) as client:
        with pytest.raises(ConfigError):
            await client.get("http://api.example/api/v1/history/stats")
        response = await client.get("http://127.0.0.1:9/ok")
    assert response.status_code == 200
    assert [str(r.url) for r in rec.requests] == ["http://127.0.0.1:9/ok"]


async def test_http_client_follows_no_redirect() -> None:
    """The wired client never follows a redirect."""
    rec = Recorder(lambda: httpx.Response(302, headers={"Location": "https://elsewhere/"}))
    answer = await make_api(rec).read("stats", TOKEN)
    assert answer.status == 302
    assert len(rec.requests) == 1


@pytest.mark.parametrize("status", [200, 201, 202])
async def test_create_token_accepts_any_2xx(status: int) -> None:
    """Token creation succeeds on any 2xx, returning the token and exactly the scopes."""
    scopes = ["cloud-sync.permanent.stats"]
    rec = Recorder(lambda: httpx.Response(status, json={"token": TOKEN.reveal(), "scopes": scopes}))
    token, granted = await make_api(rec).create_token(USER_TOKEN)
    assert (token, granted) == (TOKEN, ("cloud-sync.permanent.stats",))


PROBLEMS = "https://api.example/problems"
CHALLENGE = 'Bearer realm="api", error="invalid_token"'


@pytest.mark.parametrize(
    ("status", "answer", "code"),
    [
        (401, {"json": {"error": "invalid_token"}}, "invalid_token"),
        (403, {"json": {"code": "MissingScope"}}, None),  # not allowlisted
        (401, {"json": {"message": "Unauthorized"}}, None),
        (403, {"json": {"errors": [{"code": "insufficient_scope"}]}}, "insufficient_scope"),
        (403, {"json": {"type": f"{PROBLEMS}/invalid_scope", "title": "x"}}, "invalid_scope"),
        (401, {"headers": {"WWW-Authenticate": CHALLENGE}}, "invalid_token"),
        (500, {"text": "boom"}, None),
        (200, {"json": {"token": "not-a-dspa", "scopes": []}}, None),
        (200, {"json": {"token": TOKEN.reveal()}}, None),
        (200, {"text": "<html>"}, None),
    ],
)
async def test_create_token_errors(status: int, answer: dict[str, Any], code: str | None) -> None:
    """Refusals and malformed answers raise EnrollmentError with the code, never a token."""
    with pytest.raises(EnrollmentError) as info:
        await make_api(Recorder(lambda: httpx.Response(status, **answer))).create_token(USER_TOKEN)
    assert info.value.code == code
    assert info.value.hint
    text = str(info.value)
    for raw in (TOKEN.reveal(), USER_TOKEN.reveal(), "not-a-dspa"):
        assert raw not in text


async def test_create_token_network_error() -> None:
    """An unreachable service during creation is an EnrollmentError naming the cause."""

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(EnrollmentError, match="connect"):
        await make_api(handler).create_token(USER_TOKEN)


async def test_exchange_code_posts_the_form_with_basic_auth() -> None:
    """The code exchange posts grant, code, redirect and verifier with client_secret_basic."""
    rec = Recorder(
        lambda: httpx.Response(
            200,
            json={
                "access_token": USER_TOKEN.reveal(),
                "token_type": "Bearer",
                "scope": "openid cloud-sync.permanent.stats",
            },
        )
    )
    token, scopes = await make_api(rec).exchange_code(
        Secret("the-code-123456"),
        Secret("v" * 43),
        "https://app.example/cb",
    )
    assert token == USER_TOKEN
    assert scopes == ("openid", "cloud-sync.permanent.stats")
    request = rec.requests[0]
    assert request.method == "POST"
    assert str(request.url) == "https://account.example/auth/prefix/oidc/token"
    form = {k: v[0] for k, v in parse_qs(request.content.decode()).items()}
    assert form == {
        "grant_type": "authorization_code",
        "code": "the-code-123456",
        "redirect_uri": "https://app.example/cb",
        "code_verifier": "v" * 43,
    }
    assert request.headers["authorization"] == basic("demo-client", CLIENT_SECRET.reveal())
    assert "the-code" not in str(request.url)


async def test_exchange_code_uses_token_url_when_set() -> None:
    """service.token_url overrides the default {auth_url}/oidc/token."""
    rec = Recorder(lambda: httpx.Response(200, json={"access_token": "at-123456"}))
    settings = make_settings(token_url="https://sso.example/realm/token")
    await make_api(rec, settings).exchange_code(
        Secret("c-123456"), Secret("v" * 43), "https://app.example/cb"
    )
    assert str(rec.requests[0].url) == "https://sso.example/realm/token"


async def test_exchange_code_oauth_error() -> None:
    """An OAuth error answer raises EnrollmentError(code=<error>) without the code or verifier."""
    rec = Recorder(
        lambda: httpx.Response(
            400, json={"error": "invalid_grant", "error_description": "PKCE failed"}
        )
    )
    with pytest.raises(EnrollmentError) as info:
        await make_api(rec).exchange_code(
            Secret("c-secret-code"), Secret("v" * 43), "https://a.example/cb"
        )
    assert info.value.code == "invalid_grant"
    assert "c-secret-code" not in str(info.value)
    assert "v" * 43 not in str(info.value)


def post_only_server(request: httpx.Request) -> httpx.Response:
    """A token endpoint that accepts client_secret_post only, as some servers do."""
    form = {k: v[0] for k, v in parse_qs(request.read().decode()).items()}
    if "authorization" in request.headers or form.get("client_secret") != CLIENT_SECRET.reveal():
        return httpx.Response(401, json={"error": "invalid_client"})
    return httpx.Response(200, json={"access_token": "at-post-123456", "scope": "openid"})


async def exchange(api: ApiClient) -> Secret:
    token, _ = await api.exchange_code(
        Secret("c-123456"), Secret("v" * 43), "https://app.example/cb"
    )
    return token


@pytest.mark.parametrize(
    ("token_auth", "basic_headers"),
    [("client_secret_post", [False]), ("client_secret_basic", [True, False])],
)
async def test_exchange_code_reaches_a_client_secret_post_server(
    token_auth: str, basic_headers: list[bool]
) -> None:
    """client_secret_post sends the credentials in the form; invalid_client to
    client_secret_basic is retried once with client_secret_post."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return post_only_server(request)

    settings = make_settings(client={"token_auth": token_auth})
    assert await exchange(make_api(handler, settings)) == Secret("at-post-123456")
    assert ["authorization" in r.headers for r in seen] == basic_headers


async def test_exchange_code_rejected_by_both_client_auths_is_invalid_client() -> None:
    """A client the token endpoint refuses either way gets EnrollmentError(invalid_client)."""
    rec = Recorder(lambda: httpx.Response(401, json={"error": "invalid_client"}))
    with pytest.raises(EnrollmentError) as info:
        await exchange(make_api(rec))
    assert info.value.code == "invalid_client"
    assert len(rec.requests) == 2


def test_long_term_credential_is_token_dot_secret_and_redacted() -> None:
    """The credential is `<token>.<secret>`, masked whole by the log redactor's pattern."""
    credential = long_term_credential(TOKEN, CLIENT_SECRET)
    assert credential.reveal() == f"{TOKEN.reveal()}.{CLIENT_SECRET.reveal()}"
    assert TOKEN.reveal() not in json.dumps(scrub(f"{credential.reveal()}"))
    assert CLIENT_SECRET.reveal() not in json.dumps(scrub(f"{credential.reveal()}"))


async def test_a_read_after_the_client_closed_is_refused_as_httpx_refuses_it() -> None:
    """A closed client sends nothing: httpx's send refuses it."""
    rec = Recorder()
    settings = make_settings()
    client = http_client(settings.service, transport=httpx.MockTransport(rec))
    async with client:
        pass
    with pytest.raises(RuntimeError, match="client has been closed"):
        await api_for(client, settings).read("stats", TOKEN)
    assert rec.requests == []


# -- Content-Encoding: none asked for, any other is a broken body; the byte cap bounds the read

BOMB_CAP = 64 * 1024
BOMB_SIZE = 64 * 1024 * 1024
# The read may hold the cap and a chunk or two: far less than this (when the client still
# decoded gzip, before it was bounded: 47 MB for one layer, 148 MB for two).
PEAK_BOUND = 2 * 1024 * 1024


def _compress(chunks: Any, wbits: int) -> bytes:
    squeezer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return b"".join(squeezer.compress(chunk) for chunk in chunks) + squeezer.flush()


def gzip_bytes(data: bytes) -> bytes:
    return _compress([data], 16 + zlib.MAX_WBITS)


@cache
def gzip_bomb() -> bytes:
    """64 MiB of zeros, gzip-compressed (about 64 KB), built without holding the 64 MiB."""
    zeros = bytes(1024 * 1024)
    return _compress((zeros for _ in range(BOMB_SIZE // len(zeros))), 16 + zlib.MAX_WBITS)


async def _streamed(body: bytes, size: int = 16 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def encoded_api(body: bytes, encoding: str | None, cap: int = CAP) -> ApiClient:
    """An API client whose every answer is `body`, streamed as a server sends it."""
    headers = {"Content-Encoding": encoding} if encoding is not None else {}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=headers, content=_streamed(body))

    return make_api(handler, make_settings(max_response_bytes=cap))


async def _peak_of_read(api: ApiClient) -> tuple[Any, int]:
    """The answer of one read and the peak of memory allocated during it."""
    # A first read imports and caches what every later read reuses: not the read's memory.
    await make_api(Recorder()).read("stats", TOKEN)
    tracemalloc.start()
    try:
        answer = await api.read("stats", TOKEN)
        return answer, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(("encoding", "layers"), [("gzip", 1), ("gzip, gzip", 2)])
async def test_a_gzip_bomb_is_a_broken_body_read_in_bounded_memory(
    encoding: str, layers: int
) -> None:
    """64 MiB behind one or two gzip layers is a broken body, never inflated: a few MB."""
    body = gzip_bomb()
    for _ in range(layers - 1):
        body = gzip_bytes(body)
    answer, peak = await _peak_of_read(encoded_api(body, encoding, cap=BOMB_CAP))
    assert (answer.status, answer.error, answer.body) == (200, "decoding", b"")
    assert classify("stats", answer).reason == "broken body"
    assert peak < PEAK_BOUND, f"peak {peak:,} bytes"


ORIGINAL = json.dumps({"items": [{"id": n, "name": f"item {n}"} for n in range(40)]}).encode()


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", gzip_bytes(ORIGINAL)),
        ("x-gzip", gzip_bytes(ORIGINAL)),
        ("GZIP", gzip_bytes(ORIGINAL)),
        ("deflate", _compress([ORIGINAL], zlib.MAX_WBITS)),  # zlib-wrapped, as the RFC says
        ("deflate", _compress([ORIGINAL], -zlib.MAX_WBITS)),  # raw, as some servers send it
        ("gzip, identity", gzip_bytes(ORIGINAL)),
        ("deflate, gzip", gzip_bytes(_compress([ORIGINAL], zlib.MAX_WBITS))),
        (", ".join(["gzip"] * 6), gzip_bytes(ORIGINAL)),
        ("br, zstd, junk", b"\x8b\x01not-really-brotli"),
        ("gzip", b"this is not gzip at all"),
        ("gzip", gzip_bytes(ORIGINAL)[:10] + b"\xff" * 64),
        ("deflate", b"\xff\xff neither zlib nor raw deflate"),
        ("gzip", gzip_bytes(ORIGINAL) + bytes(CAP * 4)),  # junk past the cap on the wire
    ],
)
async def test_any_content_encoding_is_a_broken_body_of_its_answer(
    encoding: str, body: bytes
) -> None:
    """A body under any coding is a broken body of its answer (status kept), not a network error."""
    answer = await encoded_api(body, encoding).read("stats", TOKEN)
    assert (answer.status, answer.error, answer.body) == (200, "decoding", b"")
    assert classify("stats", answer).reason == "broken body"


@pytest.mark.parametrize(
    ("encoding", "size"),
    [("identity", 300), ("Identity", 300), ("identity, identity", 300), ("gzip", 0)]
    + [(None, size) for size in (0, CAP - 1, CAP, CAP + 1, CAP * 5)],
)
async def test_a_body_under_no_coding_is_read_as_sent_up_to_the_cap(
    encoding: str | None, size: int
) -> None:
    """`identity`, no Content-Encoding or an empty body: the body as sent, cut at the cap."""
    body = bytes(range(256)) * (size // 256) + b"e" * (size % 256)
    answer = await encoded_api(body, encoding).read("stats", TOKEN)
    assert (answer.status, answer.error, answer.body) == (200, None, body[:CAP])
    assert answer.truncated is (size > CAP)


@pytest.mark.parametrize(
    ("body", "echoed"),
    [
        pytest.param(json.dumps({"k": CLIENT_SECRET.reveal()}).encode(), True, id="client-secret"),
        pytest.param(json.dumps({"k": TOKEN.reveal()}).encode(), True, id="token"),
        pytest.param(b'{"k": "\\u0063l1ent-s3cret-value"}', True, id="client-secret-escaped"),
        pytest.param(b'{"k": "plain"}', False, id="no-credential"),
    ],
)
async def test_a_success_echoing_a_credential_is_marked_by_the_client(
    body: bytes, echoed: bool
) -> None:
    """A success body holding the token or the client secret is marked `echoed` by the client."""
    answer = await make_api(Recorder(lambda: httpx.Response(200, content=body))).read(
        "stats", TOKEN
    )
    assert answer.echoed is echoed
    outcome = classify("stats", answer)
    assert (outcome.reason == "credential echoed") is echoed


async def test_a_token_that_cannot_make_a_credential_sends_nothing() -> None:
    """A read or drop with an unusable token raises ValueError before any request."""
    rec = Recorder()
    api = make_api(rec)
    for token in (Secret("abc"), Secret("dspa_"), Secret("dspa_a b"), Secret("Bearer dspa_x")):
        with pytest.raises(ValueError, match="long term token"):
            await api.read("stats", token)
        with pytest.raises(ValueError, match="long term token"):
            await api.drop(token)
    assert rec.requests == []
