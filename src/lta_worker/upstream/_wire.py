"""The wire without httpx (a `run` with nobody due never imports it): the long term
credential, URLs joined and checked, what the service's refusals during enrollment mean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from lta_worker.config import is_loopback_host
from lta_worker.errors import ConfigError
from lta_worker.protocol import TOKEN_PREFIX
from lta_worker.secret import Secret

if TYPE_CHECKING:
    import httpx


def check_secure_url(url: str | httpx.URL) -> None:
    """ConfigError for plain http to a host that is not loopback, or a scheme not http(s)."""
    parts = urlsplit(str(url))
    scheme, host = parts.scheme, parts.hostname or ""
    if host and (scheme == "https" or (scheme == "http" and is_loopback_host(host))):
        return
    raise ConfigError(
        f"refusing to send a request to {scheme}://{host}: only https, or http to a "
        "loopback host, may carry credentials",
        key="service",
        hint="use https:// in service.base_url, service.auth_url and service.token_url",
    )


async def refuse_insecure(request: httpx.Request) -> None:
    """Request hook of every client built here: a last `check_secure_url` before sending."""
    check_secure_url(request.url)


def join_url(base: str, path: str) -> str:
    """Append `path` to `base`, keeping any path prefix of `base` (urljoin would drop it)."""
    return f"{base.rstrip('/')}/{path.lstrip('/')}"


def sendable(value: str) -> bool:
    """True when `value` can travel in an Authorization header as it is: visible ASCII only
    (the spec does not show the token's character set; a CR or LF would end the header)."""
    return value.isascii() and value.isprintable() and " " not in value


def usable_token(token: Secret) -> bool:
    """True when `token` can make a long term credential: `dspa_`, then at least one
    character, all of them ones an Authorization header can carry (`sendable`)."""
    raw = token.reveal()
    return raw.startswith(TOKEN_PREFIX) and len(raw) > len(TOKEN_PREFIX) and sendable(raw)


def long_term_credential(token: Secret, client_secret: Secret) -> Secret:
    """The long term credential `<token>.<client secret>` (the redactor's `dspa_` pattern
    masks it whole); ValueError when the token is not `usable_token` or the secret empty."""
    if not usable_token(token):
        raise ValueError(
            f"a long term token starts with {TOKEN_PREFIX!r}, is not empty, and holds only "
            "characters a header can carry"
        )
    if not client_secret.reveal():
        raise ValueError("the client secret is empty")
    return Secret(f"{token.reveal()}.{client_secret.reveal()}")


def create_reason(status: int) -> str:
    """The EnrollmentError reason for a refused token creation (HTTP `status`)."""
    if status == 401:
        return "token_refused"
    if status == 403:
        return "scope_refused"
    if status >= 500:
        return "service_failed"
    return "create_refused"


CREATE_HINTS: Final = {
    "token_refused": "the user access token was refused (expired, already used, or not from "
    "a consent)",
    "scope_refused": "the consent did not include a long term scope, or the mode is not "
    "opened on this client; check client.scopes, or request the mode from the operator",
    "service_failed": "the service failed",
}


def exchange_reason(error: str | None) -> str:
    """The EnrollmentError reason for a refused code exchange (OAuth `error`)."""
    if error == "invalid_grant":
        return "code_rejected"
    if error in {"invalid_client", "unauthorized_client"}:
        return "client_rejected"
    return "exchange_refused"


EXCHANGE_HINTS: Final = {
    "code_rejected": "the code expired, was already used, or its PKCE verifier does not match",
    "client_rejected": "check client.id and the client secret in client.secret_file",
}
