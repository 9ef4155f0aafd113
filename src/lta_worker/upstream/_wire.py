"""The long term credential, and the paths joined to the configured URLs: no HTTP here.

The pass engine and the drops build credentials whether or not they go on to read, and a
`run` with nobody due never builds the HTTP client; this module keeps httpx out of them.
"""

from __future__ import annotations

from lta_worker.logs import register_secret
from lta_worker.protocol import READ_PATHS, TOKEN_PREFIX, TOKENS_PATH
from lta_worker.secret import Secret

__all__ = [
    "READ_PATHS",
    "TOKENS_PATH",
    "TOKEN_PREFIX",
    "join_url",
    "long_term_credential",
    "sendable",
]


def join_url(base: str, path: str) -> str:
    """Append `path` to `base`, keeping any path prefix of `base`.

    `https://host/some/prefix` + `/api/v1/history/stats` gives
    `https://host/some/prefix/api/v1/history/stats` (urljoin would drop the prefix).
    """
    return f"{base.rstrip('/')}/{path.lstrip('/')}"


def sendable(value: str) -> bool:
    """True when `value` can travel in an Authorization header as it is: visible ASCII only.

    The spec does not show the token's character set; a space, a control character (a CR
    or LF would end the header) or a character beyond ASCII cannot be sent as is.
    """
    return value.isascii() and value.isprintable() and " " not in value


def long_term_credential(token: Secret, client_secret: Secret) -> Secret:
    """The long term credential `<token>.<client secret>`; the client secret is registered.

    Raises:
        ValueError: the token does not start with `dspa_`, is empty after it, or holds a
            character an Authorization header cannot carry (`sendable`); or the client
            secret is empty.
    """
    raw_token, raw_secret = token.reveal(), client_secret.reveal()
    if not raw_token.startswith(TOKEN_PREFIX) or len(raw_token) == len(TOKEN_PREFIX):
        raise ValueError(f"a long term token starts with {TOKEN_PREFIX!r} and is not empty")
    if not sendable(raw_token):
        raise ValueError("the long term token holds a character a header cannot carry")
    if not raw_secret:
        raise ValueError("the client secret is empty")
    # The `dspa_` pattern of the log redactor masks the token and the whole credential; the
    # client secret alone needs registering (registering per-user values would make every
    # log line scan them all).
    register_secret(client_secret)
    return Secret(f"{raw_token}.{raw_secret}")
