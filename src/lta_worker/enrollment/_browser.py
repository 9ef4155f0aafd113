"""Enrollment in the browser, without HTTP: the start from a signed link, and the callback.
The consent's OAuth state is bound to a random cookie, so only that browser can finish.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final, Literal
from urllib.parse import urlencode

from anyio import to_thread

from lta_worker.enrollment._links import EnrollLinks, LinkError
from lta_worker.errors import (
    EnrollmentError,
    LtaError,
    ModeNotOpenedError,
    UsageError,
)
from lta_worker.secret import Secret

if TYPE_CHECKING:
    from lta_worker.enrollment._enroll import Enrollment
    from lta_worker.storage import Store

OutcomeKind = Literal[
    "enrolled",
    "denied",
    "link_invalid",
    "link_expired",
    "link_used",
    "no_cookie",
    "state_mismatch",
    "consent_expired",
    "not_available",
    "failed",
    "bad_request",
]

#: The HTTP status of each outcome's page.
STATUS: Final[Mapping[OutcomeKind, int]] = {
    "enrolled": 200,
    "denied": 403,
    "link_invalid": 400,
    "link_expired": 410,
    "link_used": 410,
    "no_cookie": 400,
    "state_mismatch": 400,
    "consent_expired": 410,
    "not_available": 503,
    "failed": 502,
    "bad_request": 400,
}
_TAG: Final = b"lta-worker enroll cookie\x00"
_COOKIE: Final = re.compile(r"[A-Za-z0-9_-]{43}")


def state_for(cookie: str) -> str:
    """The OAuth state bound to a cookie value: BASE64URL(SHA256(tag || cookie))."""
    digest = hashlib.sha256(_TAG + cookie.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a step of the browser flow ended, for the page or the return URL."""

    kind: OutcomeKind
    user: str | None = None
    scopes: tuple[str, ...] = ()
    error: str | None = None  # for the log: the error's class and reason, never a value

    @property
    def status(self) -> int:
        """The HTTP status of this outcome's page."""
        return STATUS[self.kind]

    def query(self) -> str:
        """The query appended to `enroll.return_url`: the outcome, and the user when known."""
        params: dict[str, str] = {"outcome": self.kind}
        if self.user is not None:
            params["user"] = self.user
        if self.scopes:
            params["scopes"] = " ".join(self.scopes)
        return urlencode(params)


@dataclass(frozen=True, slots=True)
class Started:
    """A started consent: where to send the browser, and the cookie to give it."""

    user: str
    consent_url: str
    cookie: Secret


class FlowStopped(Exception):
    """The start could not go on; `outcome` says why."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.kind)
        self.outcome = outcome


class BrowserFlow:
    """The browser enrollment flow over an `Enrollment` (see the module docstring)."""

    def __init__(
        self,
        enrollment: Enrollment,
        store: Store,
        links: EnrollLinks,
        clock: Callable[[], datetime],
    ) -> None:
        self._enrollment = enrollment
        self._store = store
        self._links = links
        self._clock = clock

    async def start(self, link: str | None) -> Started:
        """Verify and spend the link, start the consent, bind its state to a new cookie;
        FlowStopped when the link is invalid, expired or used, or the database failed."""
        now = self._clock()
        try:
            claim = self._links.read(link, now)
        except LinkError as exc:
            raise FlowStopped(Outcome(exc.problem, exc.user)) from None
        try:
            if await to_thread.run_sync(self._store.forgotten_since, claim.user, claim.issued_at):
                raise FlowStopped(Outcome("link_expired", claim.user))  # issued before a forget
            fresh = await to_thread.run_sync(
                self._store.spend_link, claim.nonce, claim.user, now, claim.expires_at
            )
            if not fresh:
                raise FlowStopped(Outcome("link_used", claim.user))
            cookie = secrets.token_urlsafe(32)
            url = await to_thread.run_sync(
                lambda: self._enrollment.start(claim.user, state=state_for(cookie))
            )
        except LtaError as exc:  # the database, the key file
            raise FlowStopped(Outcome("failed", claim.user, error=_describe(exc))) from None
        return Started(claim.user, url, Secret(cookie))

    async def callback(self, params: Mapping[str, str], cookie: str | None) -> Outcome:
        """Check the cookie against the state, then finish the consent it belongs to."""
        state = params.get("state")
        code, error = params.get("code"), params.get("error")
        if not code and not error:
            return Outcome("bad_request")
        if not cookie or not _COOKIE.fullmatch(cookie):
            return Outcome("no_cookie")
        if not state or not hmac.compare_digest(state_for(cookie).encode(), state.encode()):
            return Outcome("state_mismatch")
        answer = {k: v for k, v in (("code", code), ("error", error)) if v}
        try:
            result = await self._enrollment.finish_state("?" + urlencode(answer), state)
        except ModeNotOpenedError:
            return Outcome("not_available", error="ModeNotOpenedError")
        except EnrollmentError as exc:
            kind: OutcomeKind = "denied" if exc.reason == "consent_denied" else "failed"
            return Outcome(kind, error=_describe(exc))
        except UsageError as exc:
            return Outcome("consent_expired", error=_describe(exc))
        except LtaError as exc:  # unreachable service, database, key file
            return Outcome("failed", error=_describe(exc))
        return Outcome("enrolled", result.user, result.scopes)


def _describe(exc: LtaError) -> str:
    return f"{type(exc).__name__}:{exc.reason}" if exc.reason else type(exc).__name__
