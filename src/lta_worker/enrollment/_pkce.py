"""PKCE (RFC 7636) and the OAuth `state`; the verifier is a `Secret` from birth."""

from __future__ import annotations

import base64
import hashlib
import secrets
import string
from typing import Final

from lta_worker.secret import Secret

#: RFC 7636 section 4.1: the characters a code verifier may use ("unreserved").
UNRESERVED: Final = frozenset(string.ascii_letters + string.digits + "-._~")
MIN_VERIFIER: Final = 43
MAX_VERIFIER: Final = 128
_VERIFIER_BYTES: Final = 64  # 64 random bytes -> 86 base64url characters (512 bits)
_STATE_BYTES: Final = 32


def new_verifier() -> Secret:
    """A new code verifier: 86 base64url characters (unreserved set) from 64 random bytes."""
    value = secrets.token_urlsafe(_VERIFIER_BYTES)
    assert MIN_VERIFIER <= len(value) <= MAX_VERIFIER
    return Secret(value)


def is_valid_verifier(verifier: Secret) -> bool:
    """True when the verifier has 43 to 128 characters, all from the unreserved set."""
    raw = verifier.reveal()
    return MIN_VERIFIER <= len(raw) <= MAX_VERIFIER and set(raw) <= UNRESERVED


def challenge_s256(verifier: Secret) -> str:
    """The S256 code challenge: BASE64URL(SHA256(ASCII(verifier))) without padding.

    Raises:
        ValueError: the verifier is not 43 to 128 unreserved characters.
    """
    if not is_valid_verifier(verifier):
        raise ValueError("a PKCE verifier must be 43 to 128 unreserved characters")
    digest = hashlib.sha256(verifier.reveal().encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def new_state() -> str:
    """A new OAuth `state` (not a secret): 43 base64url characters from 32 random bytes."""
    return secrets.token_urlsafe(_STATE_BYTES)
