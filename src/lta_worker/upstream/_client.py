"""`ApiClient`: reads, token creation and drop, code exchange, over an injected
`httpx.AsyncClient`. It alone holds the client secret; each request has a total deadline.
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import time
from collections.abc import Mapping
from dataclasses import replace
from functools import cached_property
from typing import Any
from urllib.parse import quote_plus

import anyio
import httpx

from lta_worker.config import ClientSettings, ServiceSettings
from lta_worker.domain import Answer, Endpoint, echoes, find_code
from lta_worker.errors import EnrollmentError
from lta_worker.logs import register_secret
from lta_worker.protocol import READ_PATHS, TOKEN_PREFIX, TOKENS_PATH
from lta_worker.secret import Secret
from lta_worker.upstream._wire import (
    CREATE_HINTS,
    EXCHANGE_HINTS,
    check_secure_url,
    create_reason,
    exchange_reason,
    join_url,
    long_term_credential,
    sendable,
)


def _error_kind(exc: BaseException) -> str:
    """A short, secret-free name for a transport failure (`Answer.error`)."""
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if _caused_by_tls(exc):
        return "tls"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    if isinstance(exc, httpx.ProtocolError):
        return "protocol"
    if isinstance(exc, httpx.NetworkError | OSError):
        return "reset"
    if isinstance(exc, httpx.DecodingError):
        return "decoding"
    return "transport"


def _caused_by_tls(exc: BaseException) -> bool:
    """True when an `ssl.SSLError` (certificate verification, handshake) is in the chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _service_code(answer: Answer) -> str | None:
    """The service's error code when it is one of the allowed codes (`_outcomes.find_code`)."""
    return find_code(answer.headers, answer.body)[1]


class ApiClient:
    """The service's HTTP interface (`client_secret` is registered with the redactor)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        service: ServiceSettings,
        client: ClientSettings,
        client_secret: Secret,
    ) -> None:
        self._http = http
        self._service = service
        self._timeout = httpx.Timeout(
            service.read_timeout.total_seconds(), connect=service.connect_timeout.total_seconds()
        )
        self._cap = self._service.max_response_bytes
        self._deadline = self._service.request_timeout.total_seconds()
        # Client authentication at the token endpoint: the configured method, then the
        # other one for a server that answers `invalid_client` to it.
        first = client.token_auth
        other = "client_secret_post" if first == "client_secret_basic" else "client_secret_basic"
        self._token_auths = (first, other)
        self._redirect_uri = client.redirect_uri
        self._client_id = client.id
        self._client_secret = client_secret
        # What a success body must not hold besides the token (`echoes`); a secret too short
        # to be told from data (the log redactor's bound) is not looked for.
        raw_secret = client_secret.reveal().encode()
        self._secret_bytes = (raw_secret,) if len(raw_secret) >= 6 else ()
        # Each read endpoint's URL, parsed once: httpx parses a str URL on every request.
        self._read_urls: dict[Endpoint, httpx.URL] = {
            endpoint: httpx.URL(join_url(service.base_url, path))
            for endpoint, path in READ_PATHS.items()
        }
        self._tokens_url = join_url(service.auth_url, TOKENS_PATH)

    async def read(self, endpoint: Endpoint, token: Secret) -> Answer:
        """GET one read endpoint with the user's long term credential; never raises for HTTP
        or network trouble (`Answer(status=None, error=...)`), only for an insecure URL or a
        token that is not `usable_token`. The body is read as sent, capped (`truncated`); a
        coded one is answered empty (`error="decoding"`); one echoing a secret is `echoed`.
        """
        credential = long_term_credential(token, self._client_secret)
        bearer = {"Authorization": f"Bearer {credential.reveal()}"}
        answer = await self._send("GET", self._read_urls[endpoint], bearer)
        if (
            answer.body
            and answer.status is not None
            and 200 <= answer.status < 300
            and echoes(answer.body, (token.reveal().encode(), *self._secret_bytes))
        ):
            return replace(answer, echoed=True)
        return answer

    async def create_token(self, user_access_token: Secret) -> tuple[Secret, tuple[str, ...]]:
        """Create (or rotate) the long term token of the owner of `user_access_token`: the new
        token and exactly the scopes granted; EnrollmentError (with the service's `code`)."""
        register_secret(user_access_token)
        answer = await self._send(
            "POST", self._tokens_url, {"Authorization": f"Bearer {user_access_token.reveal()}"}
        )
        if answer.status is None:
            raise EnrollmentError(
                f"could not reach the service to create the long term token ({answer.error})",
                hint="user access tokens are short-lived",
                reason="unreachable",
            )
        if not 200 <= answer.status < 300:
            raise EnrollmentError(
                f"the service refused to create the long term token (HTTP {answer.status})",
                code=_service_code(answer),
                hint=CREATE_HINTS.get(create_reason(answer.status)),
                reason=create_reason(answer.status),
            )
        data = _json_object(answer.body) or {}
        token, scopes = data.get("token"), data.get("scopes")
        if isinstance(token, str):
            register_secret(token)
        if not (isinstance(token, str) and token.startswith(TOKEN_PREFIX)):
            raise EnrollmentError(
                # The prefix is not named: the log redactor masks `dspa_` wherever it
                # appears, so the message would read "starting with '[redacted]'".
                "the service answered without a long term token (expected a `token` string "
                "with the long term prefix)",
                hint="check service.auth_url points at the account service",
                reason="no_token",
            )
        if not sendable(token):
            raise EnrollmentError(
                "the service answered with a long term token that cannot be sent back: it "
                "holds a space, a control character or a character beyond ASCII, which an "
                "Authorization header cannot carry; nothing was stored",
                reason="unsendable_token",
            )
        if not (isinstance(scopes, list) and all(isinstance(s, str) for s in scopes)):
            raise EnrollmentError(
                "the service answered without the list of granted `scopes`",
                hint="check service.auth_url points at the account service",
                reason="no_scopes",
            )
        return Secret(token), tuple(scopes)

    async def drop(self, token: Secret) -> Answer:
        """DELETE the long term token `token`; the answer, body too (a 401
        `PermanentAccessRevoked` confirms the drop, a plain 401 does not)."""
        credential = long_term_credential(token, self._client_secret)
        return await self._send(
            "DELETE", self._tokens_url, {"Authorization": f"Bearer {credential.reveal()}"}
        )

    async def exchange_code(
        self,
        code: Secret,
        verifier: Secret,
        redirect_uri: str,
    ) -> tuple[Secret, tuple[str, ...]]:
        """Exchange an authorization code and its PKCE verifier for a user access token and
        its scopes (EnrollmentError, `code` the OAuth `error`), authenticating with
        `client.token_auth`, then the other method after `invalid_client` (code unused).
        """
        for value in (code, verifier):
            register_secret(value)
        form = {
            "grant_type": "authorization_code",
            "code": code.reveal(),
            "redirect_uri": redirect_uri,
            "code_verifier": verifier.reveal(),
        }
        first, other = self._token_auths
        answer = await self._token_request(first, form)
        if answer.status == 401 and _service_code(answer) == "invalid_client":
            answer = await self._token_request(other, form)
        if answer.status is None:
            raise EnrollmentError(
                f"could not reach the token endpoint ({answer.error})", reason="unreachable"
            )
        data = _json_object(answer.body) or {}
        for key in ("access_token", "refresh_token", "id_token"):
            if isinstance(data.get(key), str):
                register_secret(data[key])
        if not 200 <= answer.status < 300:
            error = _service_code(answer)
            raise EnrollmentError(
                f"the token endpoint refused the authorization code (HTTP {answer.status})",
                code=error,
                hint=EXCHANGE_HINTS.get(exchange_reason(error)),
                reason=exchange_reason(error),
            )
        access_token, scope = data.get("access_token"), data.get("scope", "")
        if not isinstance(access_token, str) or not access_token:
            raise EnrollmentError(
                "the token endpoint answered without an access_token",
                hint="check service.token_url",
                reason="no_access_token",
            )
        scopes = tuple(scope.split()) if isinstance(scope, str) else ()
        return Secret(access_token), scopes

    async def client_accepted(self) -> bool | None:
        """Whether the token endpoint accepts the client (the breaker's `client` proof), by
        exchanging a code that names nothing: `invalid_client` False, `invalid_grant` True."""
        form = {
            "grant_type": "authorization_code",
            "code": secrets.token_urlsafe(32),
            "redirect_uri": self._redirect_uri,
            "code_verifier": secrets.token_urlsafe(48),
        }
        for method in self._token_auths:
            code = _service_code(await self._token_request(method, form))
            if code != "invalid_client":
                break
        return {"invalid_client": False, "invalid_grant": True}.get(code or "")

    async def read_path_found(self) -> bool | None:
        """Whether `service.base_url` has the read paths (the breaker's `urls` proof): a GET
        without credential answers 401 or 403 (True), 404 (False), else None."""
        answer = await self._send("GET", self._read_urls["latest-change"], {})
        return {401: True, 403: True, 404: False}.get(answer.status or 0)

    @cached_property
    def _basic_auth(self) -> Secret:
        """`client_secret_basic` (RFC 6749 2.3.1), registered with the redactor once."""
        pair = f"{quote_plus(self._client_id)}:{quote_plus(self._client_secret.reveal())}"
        encoded = base64.b64encode(pair.encode("utf-8")).decode("ascii")
        register_secret(encoded)
        return Secret("Basic " + encoded)

    async def _token_request(self, method: str, form: Mapping[str, str]) -> Answer:
        """POST the token request, authenticating the client with `method` (RFC 6749 2.3.1)."""
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
        }
        if method == "client_secret_basic":
            headers["Authorization"] = self._basic_auth.reveal()
        else:
            secret = self._client_secret.reveal()
            form = {**form, "client_id": self._client_id, "client_secret": secret}
        return await self._send("POST", self._service.token_endpoint, headers, form)

    async def _send(
        self,
        method: str,
        url: str | httpx.URL,
        headers: Mapping[str, str],
        form: Mapping[str, str] | None = None,
    ) -> Answer:
        """Send one request, read at most `max_response_bytes`, all within `request_timeout`."""
        check_secure_url(url)
        request = self._http.build_request(
            method, url, headers=headers, data=form, timeout=self._timeout
        )
        started = time.perf_counter()
        response: httpx.Response | None = None
        body, truncated, error = b"", False, None
        with anyio.move_on_after(self._deadline) as deadline:
            try:
                response = await self._http.send(request, stream=True)
                body, truncated = await self._read_capped(response)
            except (httpx.HTTPError, OSError) as exc:
                error = _error_kind(exc)
            finally:
                if response is not None:
                    with anyio.CancelScope(shield=True):
                        await response.aclose()
        elapsed = time.perf_counter() - started
        headers = {} if response is None else {k.lower(): v for k, v in response.headers.items()}
        if error is None and (deadline.cancelled_caught or response is None):
            error = "timeout"
        if error is not None or response is None:
            return Answer(status=None, headers=headers, error=error, elapsed=elapsed)
        if body and _encoded(response.headers):
            # Asked for none, a coding came: the service answered, with a body this client
            # does not read (a broken body of that answer, not a network failure).
            body, truncated, error = b"", False, "decoding"
        return Answer(
            status=response.status_code,
            headers=headers,
            body=body,
            truncated=truncated,
            error=error,
            elapsed=elapsed,
        )

    async def _read_capped(self, response: httpx.Response) -> tuple[bytes, bool]:
        """The raw body, never decoded (gzip bombs), at most `max_response_bytes`; True if more."""
        if response.is_stream_consumed:  # built with its body (a MockTransport's answer)
            content = response.content
            return content[: self._cap], len(content) > self._cap
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_raw():
            room = self._cap - size
            if len(chunk) > room:
                chunks.append(chunk[:room])
                return b"".join(chunks), True
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks), False


def _encoded(headers: httpx.Headers) -> bool:
    """True when `Content-Encoding` names any coding but `identity` (which is none)."""
    if "content-encoding" not in headers:
        return False
    codings = headers.get_list("content-encoding", split_commas=True)
    return any(c.strip().lower() not in ("", "identity") for c in codings)
