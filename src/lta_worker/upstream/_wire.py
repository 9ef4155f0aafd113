"""The long term credential, and the paths joined to the configured URLs: no HTTP here.

The API client builds credentials; the pass engine and the drops only ask `usable_token`
before they take a permit, and a `run` with nobody due never builds the HTTP client: this
module keeps httpx out of them.
"""

from __future__ import annotations

from lta_worker.protocol import TOKEN_PREFIX
from lta_worker.secret import Secret


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


def usable_token(token: Secret) -> bool:
    """True when `token` can make a long term credential: `dspa_`, then at least one
    character, all of them ones an Authorization header can carry (`sendable`)."""
    raw = token.reveal()
    return raw.startswith(TOKEN_PREFIX) and len(raw) > len(TOKEN_PREFIX) and sendable(raw)


def long_term_credential(token: Secret, client_secret: Secret) -> Secret:
    """The long term credential `<token>.<client secret>` (the API client's to build).

    The `dspa_` pattern of the log redactor masks the token and the whole credential; the
    client secret was registered once, when it was read (`runtime.Runtime`).

    Raises:
        ValueError: the token is not `usable_token`, or the client secret is empty.
    """
    if not usable_token(token):
        raise ValueError(
            f"a long term token starts with {TOKEN_PREFIX!r}, is not empty, and holds only "
            "characters a header can carry"
        )
    if not client_secret.reveal():
        raise ValueError("the client secret is empty")
    return Secret(f"{token.reveal()}.{client_secret.reveal()}")
