"""The authorization server's rules: consent (`/oidc/auth`: a queued consent, else the consent
page, else `auto_consent`) and code exchange (`/oidc/token`), with RFC 6749's errors."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote_plus, urlencode

from lta_worker.simulator.state import (
    LONG_TERM_FAMILY,
    LONG_TERM_SCOPES,
    TOKEN_PREFIX,
    AuthKind,
    Client,
    Consent,
    ConsentRequest,
    SimSettings,
    User,
    UserToken,
    World,
    default_payloads,
    digest,
    same_secret,
)

_CHALLENGE = re.compile(r"^[A-Za-z0-9_-]{43}$")
CONSENT_PAGE_TTL = timedelta(minutes=10)
MAX_CONSENT_REQUESTS = 1000
_VERIFIER = re.compile(r"^[A-Za-z0-9._~-]{43,128}$")


@dataclass(frozen=True, slots=True)
class AuthorizeAnswer:
    """The answer to a consent request: a redirect (`location`) or a 400 page (`text`)."""

    location: str | None = None
    text: str | None = None
    client: str | None = None
    user: str | None = None
    error: str | None = None
    page: ConsentPage | None = None


@dataclass(frozen=True, slots=True)
class ConsentPage:
    """What the consent page shows: the request's id, the client, the account proposed, and
    the scopes the user may untick (`openid` is always granted)."""

    request_id: str
    client: str
    account: str
    scopes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TokenAnswer:
    """The answer of the token endpoint: status, JSON body and extra headers."""

    status: int
    body: dict[str, Any]
    headers: list[tuple[str, str]] = field(default_factory=list)
    auth: AuthKind = "none"
    client: str | None = None
    user: str | None = None

    @property
    def error(self) -> str | None:
        """The OAuth error code, or None on success."""
        value = self.body.get("error")
        return value if isinstance(value, str) else None


def new_secret(prefix: str = "") -> str:
    """A fresh random opaque value (URL-safe, never containing a dot)."""
    return prefix + secrets.token_urlsafe(32)


def _redirect(uri: str, params: Mapping[str, str | None]) -> str:
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return f"{uri}{'&' if '?' in uri else '?'}{query}"


def authorize(
    world: World, settings: SimSettings, params: Mapping[str, str], now: datetime
) -> AuthorizeAnswer:
    """Handle `GET {auth_url}/oidc/auth`: validate, take the queued consent, issue a code."""
    client = world.clients.get(params.get("client_id", ""))
    if client is None:
        return AuthorizeAnswer(text="Unknown client_id.", error="invalid_client")
    redirect_uri = params.get("redirect_uri", "")
    if redirect_uri not in client.redirect_uris:
        return AuthorizeAnswer(
            text="redirect_uri is not registered for this client.",
            client=client.id,
            error="invalid_request",
        )
    state = params.get("state")

    def refuse(error: str, description: str) -> AuthorizeAnswer:
        location = _redirect(
            redirect_uri, {"error": error, "error_description": description, "state": state}
        )
        return AuthorizeAnswer(location=location, client=client.id, error=error)

    if params.get("response_type") != "code":
        return refuse("unsupported_response_type", "response_type must be code")
    requested = tuple(dict.fromkeys(params.get("scope", "").split()))
    if "openid" not in requested:
        return refuse("invalid_request", "scope must include openid")
    long_term = [s for s in requested if s.startswith(LONG_TERM_FAMILY)]
    if any(s not in LONG_TERM_SCOPES for s in long_term):
        return refuse("invalid_scope", "unknown long term scope")
    if long_term and not client.long_term:
        # The only gate of the mode (spec 4.1).
        return refuse("invalid_scope", "long term access is not enabled for this client")
    challenge = params.get("code_challenge")
    if challenge is not None:
        if params.get("code_challenge_method") != "S256":
            return refuse("invalid_request", "code_challenge_method must be S256")
        if not _CHALLENGE.match(challenge):
            return refuse("invalid_request", "malformed code_challenge")
    request = ConsentRequest(client.id, redirect_uri, state, requested, challenge, now)
    if not world.consents and settings.consent_page:
        return _show_page(world, request, params.get("login_hint"), now)
    consent = _next_consent(world, settings, params.get("login_hint"))
    if consent is None:
        return AuthorizeAnswer(
            text=(
                "No consent is queued. Queue one first: POST /_sim/consent "
                '{"user": "USER_ID", "scopes": [...]} (or start the simulator with '
                "auto-consent)."
            ),
            client=client.id,
            error="no_consent",
        )
    return _issue(world, settings, request, consent, now)


def _issue(
    world: World, settings: SimSettings, request: ConsentRequest, consent: Consent, now: datetime
) -> AuthorizeAnswer:
    """Answer a validated request as `consent` decides: a code, or `access_denied`."""
    user = _ensure_user(world, consent.user, now)
    if consent.deny:
        params = {
            "error": "access_denied",
            "error_description": "the user denied the request",
            "state": request.state,
        }
        location = _redirect(request.redirect_uri, params)
        return AuthorizeAnswer(location=location, client=request.client, user=user.id)
    granted = tuple(
        s for s in request.scopes if s == "openid" or consent.scopes is None or s in consent.scopes
    )
    code = new_secret()
    expires_at = now + timedelta(seconds=settings.code_ttl)
    world.codes[digest(code)] = replace(
        request, user=user.id, scopes=granted, expires_at=expires_at
    )
    return AuthorizeAnswer(
        location=_redirect(request.redirect_uri, {"code": code, "state": request.state}),
        client=request.client,
        user=user.id,
    )


def _show_page(
    world: World, request: ConsentRequest, login_hint: str | None, now: datetime
) -> AuthorizeAnswer:
    """Keep the validated request under a new id and describe the consent page to show."""
    for key, old in list(world.consent_requests.items()):
        if old.expires_at <= now or len(world.consent_requests) >= MAX_CONSENT_REQUESTS:
            del world.consent_requests[key]
    request_id = new_secret()
    world.consent_requests[request_id] = replace(request, expires_at=now + CONSENT_PAGE_TTL)
    account = login_hint or f"demo-user-{world.auto_users + 1}"
    scopes = tuple(s for s in request.scopes if s != "openid")
    page = ConsentPage(request_id, request.client, account, scopes)
    return AuthorizeAnswer(client=request.client, page=page)


def decide(
    world: World, settings: SimSettings, form: Mapping[str, list[str]], now: datetime
) -> AuthorizeAnswer:
    """Handle the consent page's form (`POST {auth_url}/oidc/consent`): `request`, `account`,
    `decision` (`allow` | `deny`) and one `scope` per ticked box. The request is used once."""
    request_id = (form.get("request") or [""])[0]
    request = world.consent_requests.pop(request_id, None)
    if request is None or request.expires_at <= now:
        return AuthorizeAnswer(text="This consent request is unknown, used or expired.")
    account = (form.get("account") or [""])[0].strip()
    decision = (form.get("decision") or [""])[0]
    if not account or decision not in {"allow", "deny"}:
        return AuthorizeAnswer(text="The consent form needs an account and a decision.")
    if account.startswith("demo-user-"):
        world.auto_users += 1
    ticked = tuple(s for s in form.get("scope", []) if s in request.scopes)
    consent = Consent(user=account, scopes=ticked, deny=decision == "deny")
    return _issue(world, settings, request, consent, now)


def _next_consent(world: World, settings: SimSettings, hint: str | None) -> Consent | None:
    if world.consents:
        return world.consents.popleft()
    if not settings.auto_consent:
        return None
    if hint:
        return Consent(user=hint)
    world.auto_users += 1
    return Consent(user=f"demo-user-{world.auto_users}")


def _ensure_user(world: World, user_id: str, now: datetime) -> User:
    user = world.users.get(user_id)
    if user is None or user.deleted:
        # A consent for an unknown user creates a linked, recently synced account.
        user = User(
            id=user_id, last_sync_at=now - timedelta(days=1), payloads=default_payloads(user_id)
        )
        world.users[user_id] = user
    return user


def _oauth_error(
    status: int, error: str, description: str, auth: AuthKind = "none", client: str | None = None
) -> TokenAnswer:
    headers = [("Cache-Control", "no-store")]
    if error == "invalid_client" and auth == "basic":
        headers.append(("WWW-Authenticate", 'Basic realm="auth"'))
    return TokenAnswer(
        status=status,
        body={"error": error, "error_description": description},
        headers=headers,
        auth=auth,
        client=client,
    )


def _client_auth(
    world: World, form: Mapping[str, str], authorization: str | None
) -> tuple[AuthKind, Client | None, str | None]:
    """Authenticate the client: (method, client or None, error description or None)."""
    basic = authorization is not None and authorization[:6].lower() == "basic "
    if basic and "client_secret" in form:
        return "basic", None, "use one client authentication method"
    if basic:
        assert authorization is not None
        try:
            decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return "basic", None, "malformed Basic credentials"
        if ":" not in decoded:
            return "basic", None, "malformed Basic credentials"
        # RFC 6749 2.3.1: id and secret are form-urlencoded before Basic encoding.
        raw_id, raw_secret = decoded.split(":", 1)
        kind: AuthKind = "basic"
        client_id, secret = unquote_plus(raw_id), unquote_plus(raw_secret)
    elif "client_secret" in form:
        kind, client_id, secret = "post", form.get("client_id", ""), form["client_secret"]
    else:
        return "none", None, "client authentication is required"
    client = world.clients.get(client_id)
    if client is None or not same_secret(secret, client.secret):
        return kind, None, "client authentication failed"
    if form.get("client_id", client.id) != client.id:
        return kind, None, "client_id does not match the authenticated client"
    return kind, client, None


def exchange(
    world: World,
    settings: SimSettings,
    form: Mapping[str, str] | None,
    authorization: str | None,
    now: datetime,
) -> TokenAnswer:
    """Handle `POST {auth_url}/oidc/token` (authorization_code); `form` None: not a form."""
    if form is None:
        return _oauth_error(400, "invalid_request", "the body must be a urlencoded form")
    kind, client, problem = _client_auth(world, form, authorization)
    if client is None:
        return _oauth_error(401, "invalid_client", problem or "client authentication failed", kind)

    def bad(error: str, description: str) -> TokenAnswer:
        return _oauth_error(400, error, description, kind, client.id)

    if form.get("grant_type") != "authorization_code":
        return bad("unsupported_grant_type", "only authorization_code is supported")
    code = form.get("code")
    if not code:
        return bad("invalid_request", "code is required")
    record = world.codes.get(digest(code))
    if record is None or record.client != client.id or record.expires_at <= now:
        return bad("invalid_grant", "the code is invalid, expired or already used")
    if form.get("redirect_uri") != record.redirect_uri:
        return bad("invalid_grant", "redirect_uri does not match the authorization request")
    verifier = form.get("code_verifier")
    if record.challenge is None and verifier is not None:
        return bad("invalid_grant", "no code_challenge was sent with the authorization request")
    if record.challenge is not None and not (
        verifier is not None
        and _VERIFIER.match(verifier)
        and same_secret(s256(verifier), record.challenge)
    ):
        return bad("invalid_grant", "PKCE verification failed")
    # Single use: the code is gone once exchanged.
    del world.codes[digest(code)]
    user = world.users.get(record.user)
    if user is None or user.deleted:
        return bad("invalid_grant", "the user no longer exists")
    token = new_secret()
    while token.startswith(TOKEN_PREFIX):  # pragma: no cover - astronomically unlikely
        token = new_secret()
    world.user_tokens[digest(token)] = UserToken(
        client=client.id,
        user=record.user,
        scopes=record.scopes,
        expires_at=now + timedelta(seconds=settings.user_token_ttl),
    )
    return TokenAnswer(
        status=200,
        body={
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": settings.user_token_ttl,
            "scope": " ".join(record.scopes),
        },
        headers=[("Cache-Control", "no-store"), ("Pragma", "no-cache")],
        auth=kind,
        client=client.id,
        user=record.user,
    )


def s256(verifier: str) -> str:
    """The PKCE S256 challenge of a verifier: BASE64URL(SHA256(verifier)) without padding."""
    raw = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
