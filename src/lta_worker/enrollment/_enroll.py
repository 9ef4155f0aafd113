"""Enrollment: consent with PKCE, code exchange, long term token creation, encrypted storage
(docs/python-api.md). No token, code or verifier ever reaches a log line or a message.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import secrets
import string
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Final, Literal, get_args
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from anyio import to_thread

from lta_worker.domain import OAUTH_CODES, PendingEnrollment
from lta_worker.errors import (
    EnrollmentError,
    ModeNotOpenedError,
    StorageError,
    UsageError,
)
from lta_worker.logs import get_logger, register_secret
from lta_worker.protocol import AUTHORIZE_PATH, LONG_TERM_SCOPES, OPENID_SCOPE
from lta_worker.secret import Secret

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from lta_worker.config import ClientSettings
    from lta_worker.storage import Store, Vault
    from lta_worker.upstream import ApiClient

PENDING_TTL: Final = timedelta(minutes=10)
MAX_USER_LEN: Final = 255
_QUERY_KEY: Final = re.compile(r"(^|[?&])(code|state|error)=")


# -- PKCE (RFC 7636) and the OAuth `state`; the verifier is a `Secret` from birth ----------
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
    """The S256 code challenge: BASE64URL(SHA256(ASCII(verifier))) without padding."""
    if not is_valid_verifier(verifier):
        raise ValueError("a PKCE verifier must be 43 to 128 unreserved characters")
    digest = hashlib.sha256(verifier.reveal().encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def new_state() -> str:
    """A new OAuth `state` (not a secret): 43 base64url characters from 32 random bytes."""
    return secrets.token_urlsafe(_STATE_BYTES)


# `enroll.failed`'s `stage`, and its `error_code` at stage `state` (no service code there):
# docs/log-events.md lists them, and a test keeps it so.
FailureStage = Literal["state", "consent", "exchange", "create", "store"]
FAILURE_STAGES: Final[tuple[FailureStage, ...]] = get_args(FailureStage)
StateFailure = Literal["no_pending", "unknown_state", "other_user"]
STATE_FAILURES: Final[tuple[StateFailure, ...]] = get_args(StateFailure)


log = get_logger("lta_worker.enroll")


@dataclass(frozen=True, slots=True)
class EnrollResult:
    """A finished enrollment: who, the scopes granted, and whether a token was rotated."""

    user: str
    scopes: tuple[str, ...]
    rotated: bool


@dataclass(frozen=True, slots=True)
class RedirectParams:
    """What came back from the consent: the code (a Secret) and state, or an OAuth error."""

    code: Secret | None
    state: str | None
    error: str | None = None


def check_user_id(user: str) -> str:
    """The user id when usable (1-255 printable characters, no outer space); else UsageError."""
    if not user or len(user) > MAX_USER_LEN or not user.isprintable() or user != user.strip():
        raise UsageError(
            "a user id is 1 to 255 printable characters without surrounding spaces",
            hint="use your application's own stable user id",
        )
    return user


def parse_redirect(text: str) -> RedirectParams:
    """The consent's answer from a redirect URL, a query string, or a bare code (UsageError)."""
    text = text.strip()
    if not text:
        raise UsageError("no code or redirect URL was given on stdin", reason="no_input")
    if "://" in text or text.startswith("?") or _QUERY_KEY.search(text):
        query = urlsplit(text).query if "://" in text else text.lstrip("?")
        params = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
        code = params.get("code") or None
        if code:
            register_secret(code)
        if not code and not params.get("error"):
            raise UsageError(
                "the redirect URL holds neither `code` nor `error`",
                hint="paste the whole address the browser was sent back to",
            )
        return RedirectParams(
            code=Secret(code) if code else None,
            state=params.get("state") or None,
            error=_safe_error(params.get("error")),
        )
    if any(c.isspace() for c in text):
        raise UsageError("a code is one word; paste the code or the whole redirect URL")
    register_secret(text)
    return RedirectParams(code=Secret(text), state=None)


class ClientOperation:
    """Holds the collaborators of a user operation; `api` may be a function returning the
    client for every request (the runtime builds its HTTP client lazily, anew on SIGHUP)."""

    def __init__(
        self,
        store: Store,
        vault: Vault,
        api: ApiClient | Callable[[], ApiClient],
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._vault = vault
        self._api_source = api
        self._clock = clock

    @property
    def _api(self) -> ApiClient:
        source = self._api_source
        return source() if callable(source) else source


class Enrollment(ClientOperation):
    """Enrolls users: the consent URL (at `auth_url`), the redirect back, or a user token."""

    def __init__(
        self,
        client: ClientSettings,
        store: Store,
        vault: Vault,
        api: ApiClient | Callable[[], ApiClient],
        clock: Callable[[], datetime],
        *,
        auth_url: str,
    ) -> None:
        super().__init__(store, vault, api, clock)
        self._client = client
        self._auth_url = auth_url

    def consent_url(self, state: str, challenge: str) -> str:
        """The authorization URL for one consent: `{auth_url}/oidc/auth?...`."""
        client = self._client
        query = urlencode(
            {
                "client_id": client.id,
                "redirect_uri": client.redirect_uri,
                "response_type": "code",
                "scope": " ".join((OPENID_SCOPE, *client.scopes)),
                "state": state,
                "code_challenge": challenge,
                "code_challenge_method": "S256",
            },
            quote_via=quote,
        )
        from lta_worker.upstream import join_url

        return f"{join_url(self._auth_url, AUTHORIZE_PATH)}?{query}"

    def start(self, user: str, *, state: str | None = None) -> str:
        """Begin enrolling `user`; the consent URL to send their browser to. A `state` given
        must be fresh and unguessable (`BrowserFlow` derives it from its cookie)."""
        check_user_id(user)
        now = self._clock()
        verifier, state = new_verifier(), state or new_state()
        register_secret(verifier)
        pending = PendingEnrollment(
            user=user,
            verifier=self._vault.encrypt(verifier, user=user, purpose="verifier"),
            redirect_uri=self._client.redirect_uri,
            created_at=now,
            expires_at=now + PENDING_TTL,
        )
        self._store.save_pending(state, pending)
        log.info(
            "enroll.started",
            user=user,
            scopes=list(self._client.scopes),
            expires_at=pending.expires_at.isoformat(),
        )
        return self.consent_url(state, challenge_s256(verifier))

    async def finish(
        self, user: str, code_or_redirect_url: str, *, state: str | None = None
    ) -> EnrollResult:
        """Complete the enrollment `start` began, from the redirect URL or a bare code (which
        finishes the user's newest consent: a web app should pass the `state`).

        Raises:
            UsageError: no code, or the state is unknown, used, expired or for another user.
            ModeNotOpenedError: the consent answered `invalid_scope` (exit 78).
            EnrollmentError: the consent, the exchange or the token creation failed.
        """
        check_user_id(user)
        return await self._finish(user, _with_state(parse_redirect(code_or_redirect_url), state))

    async def finish_state(self, code_or_redirect_url: str, state: str) -> EnrollResult:
        """Complete the consent of `state` for the user it was started for (else as `finish`)."""
        return await self._finish(None, _with_state(parse_redirect(code_or_redirect_url), state))

    async def _finish(self, user: str | None, params: RedirectParams) -> EnrollResult:
        if params.error:
            pending = None
            if params.state:
                now = self._clock()
                pending = await to_thread.run_sync(self._store.take_pending, params.state, now)
            who = user or (pending.user if pending is not None else None)
            raise self._consent_error(who, params)
        pending = await self._take_pending(user, params.state)
        user = pending.user
        assert params.code is not None
        verifier = self._vault.decrypt(pending.verifier, user=pending.user, purpose="verifier")
        register_secret(verifier)
        try:
            user_token, _ = await self._api.exchange_code(
                params.code, verifier, pending.redirect_uri
            )
        except EnrollmentError as exc:
            _failed(user, "exchange", exc.code)
            raise
        return await self._create_and_store(user, user_token)

    async def from_user_token(self, user: str, user_access_token: Secret) -> EnrollResult:
        """Enroll `user` with a user access token from a long term consent (EnrollmentError)."""
        check_user_id(user)
        register_secret(user_access_token)
        if not user_access_token.reveal().strip():
            raise UsageError("no user access token was given on stdin")
        return await self._create_and_store(user, user_access_token)

    async def _take_pending(self, user: str | None, state: str | None) -> PendingEnrollment:
        now = self._clock()
        if state is None:
            assert user is not None  # finish_state always has a state
            # A bare code: the user's newest consent started here. PKCE still binds the
            # code to that consent's verifier, so a code minted elsewhere fails the exchange.
            latest = await to_thread.run_sync(self._store.take_latest_pending, user, now)
            if latest is None:
                _failed(user, "state", "no_pending")
                raise UsageError(
                    f"no consent was started for {user!r} in the last "
                    f"{int(PENDING_TTL.total_seconds() // 60)} minutes, or it was finished",
                    reason="no_pending_consent",
                )
            return latest
        pending = await to_thread.run_sync(self._store.take_pending, state, now)
        if pending is None:
            _failed(user, "state", "unknown_state")
            raise UsageError(
                "this consent is unknown, already used, or expired (a consent is valid for "
                f"{int(PENDING_TTL.total_seconds() // 60)} minutes and can be finished once)",
                reason="unknown_consent",
            )
        if user is not None and pending.user != user:
            _failed(user, "state", "other_user")
            raise UsageError(
                f"this consent was started for another user, not {user!r}; it is now void",
                reason="other_user_consent",
            )
        return pending

    def _consent_error(self, user: str | None, params: RedirectParams) -> Exception:
        _failed(user, "consent", params.error)
        if params.error == "invalid_scope":
            return _mode_not_opened()
        if params.error == "access_denied":
            return EnrollmentError(
                "the user did not give consent", code=params.error, reason="consent_denied"
            )
        return EnrollmentError("the consent failed", code=params.error, reason="consent_failed")

    async def _create_and_store(self, user: str, user_token: Secret) -> EnrollResult:
        try:
            token, scopes = await self._api.create_token(user_token)
        except EnrollmentError as exc:
            _failed(user, "create", exc.code)
            if exc.code == "invalid_scope":
                raise _mode_not_opened() from None
            raise
        register_secret(token)
        # The spec's grant holds long term scopes only; anything else is not stored.
        scopes = tuple(s for s in scopes if s in LONG_TERM_SCOPES)
        if not scopes:
            await self._drop_orphan(token)  # live upstream, but it can read nothing
            _failed(user, "create", None)
            raise EnrollmentError(
                "the service granted none of the long term scopes "
                f"({', '.join(LONG_TERM_SCOPES)}); its token was dropped, nothing was stored",
                reason="no_scopes",
            )
        now = self._clock()
        try:
            encrypted = self._vault.encrypt(token, user=user)
            rotated = await to_thread.run_sync(
                partial(self._store.store_token, user, encrypted, scopes, now, next_due_at=now)
            )
        except StorageError:
            # The service already holds this token and it lives until revoked: drop it
            # rather than leave a live credential that nobody knows.
            await self._drop_orphan(token)
            _failed(user, "store", None)
            raise
        log.info("enroll.completed", user=user, scopes=list(scopes), rotated=rotated)
        return EnrollResult(user=user, scopes=scopes, rotated=rotated)

    async def _drop_orphan(self, token: Secret) -> None:
        with contextlib.suppress(ValueError):  # never sent: nothing to drop
            await self._api.drop(token)


def _with_state(params: RedirectParams, state: str | None) -> RedirectParams:
    """`params` with the state the caller holds (which the redirect's own must match)."""
    if state is None:
        return params
    if params.state is not None and params.state != state:
        raise UsageError("the redirect URL's state differs from the state given")
    return replace(params, state=state)


def _safe_error(value: str | None) -> str | None:
    """An allowed OAuth `error` code, else `unrecognised_error` (anyone can craft a redirect)."""
    if not value:
        return None
    return value if value in OAUTH_CODES else "unrecognised_error"


def _mode_not_opened() -> ModeNotOpenedError:
    return ModeNotOpenedError(
        "the service refused the long term scopes (invalid_scope): the long term mode is "
        "not opened on this client",
        hint="request it from the operator (contact form or chat, see the spec's section 1); "
        "there is nothing to fix in lta-worker's configuration",
    )


def _failed(user: str | None, stage: FailureStage, error_code: str | StateFailure | None) -> None:
    log.warning("enroll.failed", user=user, stage=stage, error_code=error_code)
