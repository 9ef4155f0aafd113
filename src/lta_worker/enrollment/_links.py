"""Signed, expiring, single-use enrollment links: `{enroll.public_url}/enroll/start?link=...`
(the user id, expiry, issue time and a nonce; signed, not encrypted: it holds no secret).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal
from urllib.parse import urlencode

from lta_worker.enrollment._enroll import check_user_id
from lta_worker.errors import UsageError
from lta_worker.secret import Secret

SALT: Final = "lta-worker.enroll-link.v1"
START_QUERY: Final = "link"
MIN_VALID: Final = timedelta(minutes=1)
MAX_VALID: Final = timedelta(days=30)
MAX_TOKEN_LEN: Final = 2048

LinkProblem = Literal["link_invalid", "link_expired"]


class LinkError(Exception):
    """A link that cannot start an enrollment (`user`: when the signature was good)."""

    def __init__(self, problem: LinkProblem, user: str | None = None) -> None:
        super().__init__(problem)
        self.problem: LinkProblem = problem
        self.user = user


@dataclass(frozen=True, slots=True)
class LinkClaim:
    """What a verified link says: for whom, until when, and its nonce (spent once)."""

    user: str
    expires_at: datetime
    nonce: str
    issued_at: datetime | None = None  # None: a link of an older version


class EnrollLinks:
    """Makes and verifies enrollment links with `keys` (oldest first, the last signs)."""

    def __init__(self, keys: Sequence[Secret], start_url: str) -> None:
        if not keys:
            raise ValueError("at least one link key is needed")
        from itsdangerous import URLSafeSerializer  # imported when links are used

        self._serializer = URLSafeSerializer([k.reveal() for k in keys], salt=SALT)
        self.start_url = start_url

    def make(self, user: str, now: datetime, valid: timedelta) -> str:
        """A link for `user`, valid from `now` for `valid` (1 min to 30 days; else UsageError)."""
        check_user_id(user)
        if not MIN_VALID <= valid <= MAX_VALID:
            raise UsageError("a link is valid for 1 minute to 30 days", hint="--valid 24h")
        payload = {
            "u": user,
            "x": int((now + valid).timestamp()),
            "i": int(now.timestamp() * 1000),
            "n": secrets.token_urlsafe(16),
        }
        token = self._serializer.dumps(payload)
        return f"{self.start_url}?{urlencode({START_QUERY: token})}"

    def read(self, token: str | None, now: datetime) -> LinkClaim:
        """Verify a link's token and its expiry (LinkError `link_invalid` or `link_expired`)."""
        if not token or len(token) > MAX_TOKEN_LEN:
            raise LinkError("link_invalid")
        from itsdangerous import BadSignature

        try:
            payload: Any = self._serializer.loads(token)
        except BadSignature:
            raise LinkError("link_invalid") from None
        claim = _claim(payload)
        if claim is None:
            raise LinkError("link_invalid")
        if now >= claim.expires_at:
            raise LinkError("link_expired", claim.user)
        return claim


def _claim(payload: Any) -> LinkClaim | None:
    """The claim of a well-formed payload, else None (another shape: a key leak or a bug)."""
    if not isinstance(payload, dict):
        return None
    user, expiry, nonce = payload.get("u"), payload.get("x"), payload.get("n")
    if not isinstance(user, str) or not isinstance(nonce, str) or not nonce:
        return None
    if not isinstance(expiry, int) or isinstance(expiry, bool) or not 0 < expiry < 2**33:
        return None
    issued = payload.get("i")
    if issued is not None and (type(issued) is not int or not 0 < issued < 2**43):
        return None
    try:
        check_user_id(user)
    except UsageError:
        return None
    at = None if issued is None else datetime.fromtimestamp(issued / 1000, UTC)
    return LinkClaim(user, datetime.fromtimestamp(expiry, UTC), nonce, at)
