"""The resource side of long term access: who is calling, enrollment, drop, and the reads
(checked in the spec's order: authentication, revocation, scope, the account, the data)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from lta_worker.simulator.oauth import new_secret
from lta_worker.simulator.responses import (
    FORBIDDEN,
    INACTIVE,
    NOT_FOUND,
    REVOKED,
    UNAUTHORIZED,
    UNLINKED,
    Refusal,
)
from lta_worker.simulator.state import (
    ENDPOINT_SCOPES,
    HISTORY_SCOPE,
    LONG_TERM_SCOPES,
    TOKEN_PREFIX,
    AuthKind,
    Endpoint,
    Grant,
    SimSettings,
    World,
    default_payloads,
    digest,
    same_secret,
)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from once proven (`client`, `user`), or the `refusal` it gets."""

    auth: AuthKind
    client: str | None = None
    user: str | None = None
    scopes: tuple[str, ...] = ()
    refusal: Refusal | None = None


@dataclass(frozen=True, slots=True)
class EnrollAnswer:
    """The answer of token creation: `status` with `body`, or a refusal."""

    caller: Caller
    status: int = 401
    body: dict[str, Any] | None = None
    refusal: Refusal | None = None


def _credential(authorization: str | None) -> tuple[AuthKind, str | None]:
    """The kind of an Authorization header and its `Bearer` credential, if any."""
    if authorization is None:
        return "none", None
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not value or " " in value:
        return "other", None
    return ("long_term" if value.startswith(TOKEN_PREFIX) else "regular"), value


def _prove_long_term(world: World, credential: str) -> tuple[str, Grant] | None:
    """Return (token hash, grant) when both halves of `<token>.<client secret>` are correct."""
    token, dot, secret = credential.partition(".")
    if not dot or len(token) <= len(TOKEN_PREFIX) or not secret:
        return None
    token_hash = digest(token)
    grant = world.grants.get(token_hash)
    client = world.clients.get(grant.client) if grant else None
    if grant is None or client is None or not same_secret(secret, client.secret):
        return None
    return token_hash, grant


def identify(
    world: World,
    authorization: str | None,
    client_header: str | None,
    now: datetime,
    *,
    long_term: bool = True,
) -> Caller:
    """Authenticate a public-API request; `long_term=False` refuses `dspa_` credentials."""
    kind, bearer = _credential(authorization)
    if bearer is None:
        return Caller(kind, refusal=UNAUTHORIZED)
    if kind == "long_term":
        proven = _prove_long_term(world, bearer) if long_term else None
        if proven is None:
            return Caller(kind, refusal=UNAUTHORIZED)
        _, grant = proven
        if grant.revoked:
            return Caller(kind, grant.client, grant.user, refusal=Refusal(401, REVOKED))
        grant.last_used_at = now
        return Caller(kind, grant.client, grant.user, grant.scopes)
    record = world.user_tokens.get(digest(bearer))
    if record is None or record.expires_at <= now or client_header != record.client:
        return Caller(kind, refusal=UNAUTHORIZED)
    user = world.users.get(record.user)
    if user is None or user.deleted:
        return Caller(kind, refusal=UNAUTHORIZED)
    return Caller(kind, record.client, record.user, record.scopes)


def read(
    world: World, settings: SimSettings, caller: Caller, endpoint: Endpoint, now: datetime
) -> tuple[Refusal | None, Any]:
    """Decide a read of `endpoint` by an identified caller: (a refusal, or None and the payload)."""
    if caller.refusal is not None or caller.client is None or caller.user is None:
        return caller.refusal or UNAUTHORIZED, None
    client = world.clients[caller.client]
    if caller.auth == "long_term":
        scope = ENDPOINT_SCOPES[endpoint]
        if scope not in caller.scopes or scope not in client.enabled_scopes:
            return FORBIDDEN, None
    elif HISTORY_SCOPE not in caller.scopes:
        return FORBIDDEN, None
    user = world.users.get(caller.user)
    if user is None or user.deleted:
        return UNAUTHORIZED, None
    if not user.linked:
        return Refusal(401, UNLINKED), None
    silent_for = None if user.last_sync_at is None else now - user.last_sync_at
    if silent_for is None or silent_for > timedelta(days=settings.inactive_after_days):
        return Refusal(403, INACTIVE), None
    payload = (
        user.payloads[endpoint]
        if endpoint in user.payloads
        else default_payloads(user.id)[endpoint]
    )
    if payload is None:
        return NOT_FOUND, None
    return None, payload


def enroll(
    world: World, settings: SimSettings, authorization: str | None, now: datetime
) -> EnrollAnswer:
    """Handle `POST {auth_url}/api/long-term-access/tokens`: create or rotate a token."""
    kind, bearer = _credential(authorization)
    if bearer is None or kind != "regular":
        # Spec 5.4: only a user access token; a long term credential gets a plain 401.
        return EnrollAnswer(Caller(kind), refusal=UNAUTHORIZED)
    record = world.user_tokens.get(digest(bearer))
    user = world.users.get(record.user) if record else None
    if record is None or record.expires_at <= now or user is None or user.deleted:
        return EnrollAnswer(Caller(kind), refusal=UNAUTHORIZED)
    caller = Caller(kind, record.client, record.user, record.scopes)
    scopes = tuple(s for s in record.scopes if s in LONG_TERM_SCOPES)
    if not scopes:
        refusal = Refusal(403, "insufficient_scope", "The user token carries no long term scope.")
        return EnrollAnswer(caller, refusal=refusal)
    if not world.clients[record.client].long_term:
        refusal = Refusal(403, "invalid_scope", "Long term access is not enabled for this client.")
        return EnrollAnswer(caller, refusal=refusal)
    previous = world.active.get((record.user, record.client))
    if previous is not None:
        # Rotation: the previous token is forgotten, so it gets a plain 401 from now on.
        world.forget(previous)
    token = new_secret(TOKEN_PREFIX)
    token_hash = digest(token)
    world.grants[token_hash] = Grant(
        user=record.user, client=record.client, scopes=scopes, created_at=now
    )
    world.active[(record.user, record.client)] = token_hash
    return EnrollAnswer(
        caller,
        status=settings.enroll_status,
        body={"token": token, "scopes": list(scopes)},
    )


def drop(world: World, settings: SimSettings, authorization: str | None) -> Caller:
    """Handle `DELETE {auth_url}/api/long-term-access/tokens` (always 204): the token goes only
    when both halves are correct, then answers as `settings.after_delete` says."""
    kind, bearer = _credential(authorization)
    proven = _prove_long_term(world, bearer) if bearer and kind == "long_term" else None
    if proven is None:
        return Caller(kind)
    token_hash, grant = proven
    if settings.after_delete == "revoked":
        world.revoke(token_hash)
    else:
        world.forget(token_hash)
    return Caller(kind, grant.client, grant.user)
