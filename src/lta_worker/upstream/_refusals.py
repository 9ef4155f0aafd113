"""What the service's refusals during enrollment mean: the `EnrollmentError` reason for a
refused token creation (by HTTP status) or code exchange (by OAuth `error`), and a hint in
terms of settings and the service (the CLI's own advice is in `cli/_hints.py`)."""

from __future__ import annotations

from typing import Final


def create_reason(status: int) -> str:
    """The EnrollmentError reason for a refused token creation (HTTP `status`)."""
    if status == 401:
        return "token_refused"
    if status == 403:
        return "scope_refused"
    if status >= 500:
        return "service_failed"
    return "create_refused"


_CREATE_HINTS: Final = {
    "token_refused": "the user access token was refused (expired, already used, or not from "
    "a consent)",
    "scope_refused": "the consent did not include a long term scope, or the mode is not "
    "opened on this client; check client.scopes, or request the mode from the operator",
    "service_failed": "the service failed",
}


def create_hint(status: int) -> str | None:
    """What to do about a refused token creation, in terms of settings and the service."""
    return _CREATE_HINTS.get(create_reason(status))


def exchange_reason(error: str | None) -> str:
    """The EnrollmentError reason for a refused code exchange (OAuth `error`)."""
    if error == "invalid_grant":
        return "code_rejected"
    if error in {"invalid_client", "unauthorized_client"}:
        return "client_rejected"
    return "exchange_refused"


_EXCHANGE_HINTS: Final = {
    "code_rejected": "the code expired, was already used, or its PKCE verifier does not match",
    "client_rejected": "check client.id and the client secret in client.secret_file",
}


def exchange_hint(error: str | None) -> str | None:
    """What to do about a refused code exchange, in terms of settings and the service."""
    return _EXCHANGE_HINTS.get(exchange_reason(error))
