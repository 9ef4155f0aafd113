"""The service's records and clock: plain data, tokens and codes kept only as SHA-256 hashes.

The scope names are spelled out, not imported from the worker: an independent reading of
the spec, so a typo on one side shows up.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, Protocol, get_args

from lta_worker.simulator.budget import HeaderFormat, Window

LATEST_CHANGE_SCOPE: Final = "cloud-sync.permanent.latest-change"
STATS_SCOPE: Final = "cloud-sync.permanent.stats"
HISTORY_SCOPE: Final = "cloud-sync.history"
LONG_TERM_SCOPES: Final = (LATEST_CHANGE_SCOPE, STATS_SCOPE)
LONG_TERM_FAMILY: Final = "cloud-sync.permanent."
TOKEN_PREFIX: Final = "dspa_"  # noqa: S105 - a prefix, not a secret
ANONYMOUS: Final = ""  # budget key of requests that prove no client
LOG_LIMIT: Final = 10_000

Endpoint = Literal["latest-change", "stats"]
ENDPOINTS: Final[tuple[Endpoint, ...]] = get_args(Endpoint)
ENDPOINT_SCOPES: Final[dict[Endpoint, str]] = {
    "latest-change": LATEST_CHANGE_SCOPE,
    "stats": STATS_SCOPE,
}

ErrorStyle = Literal["json", "code", "nested", "problem", "header"]
ERROR_STYLES: Final[tuple[ErrorStyle, ...]] = get_args(ErrorStyle)
AfterDelete = Literal["plain", "revoked"]
AuthKind = Literal["none", "long_term", "regular", "basic", "post", "other"]

DEMO_CLIENT_ID: Final = "demo-client"
DEMO_CLIENT_SECRET: Final = "demo-client-secret-not-for-production"  # noqa: S105 - a demo value
PLAIN_CLIENT_ID: Final = "plain-client"
PLAIN_CLIENT_SECRET: Final = "plain-client-secret-not-for-production"  # noqa: S105 - a demo value
DEFAULT_REDIRECT_URIS: Final = (
    "http://127.0.0.1/lta/callback",
    "http://localhost/lta/callback",
    "https://app.example/lta/callback",
)


def digest(value: str) -> str:
    """Return the hex SHA-256 of a token or code: the only form in which one is kept."""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def same_secret(given: str, expected: str) -> bool:
    """Compare two secrets in constant time."""
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class SimSettings:
    """The knobs of one simulator (docs/simulator.md, "Settings"); see `Simulator.configure`."""

    budget: int = 120
    window: int = 3600
    header_format: HeaderFormat = "draft"
    error_style: ErrorStyle = "json"
    enroll_status: int = 201
    after_delete: AfterDelete = "plain"
    auto_consent: bool = False
    consent_page: bool = False
    code_ttl: int = 60
    user_token_ttl: int = 3600
    inactive_after_days: int = 90


@dataclass(slots=True)
class Client:
    """A registered API client (application type `API / Server`, with a secret)."""

    id: str
    secret: str = field(repr=False)
    redirect_uris: set[str] = field(default_factory=lambda: set(DEFAULT_REDIRECT_URIS))
    long_term: bool = False
    enabled_scopes: set[str] = field(default_factory=lambda: set(LONG_TERM_SCOPES))


@dataclass(slots=True)
class User:
    """An account, with its cloud sync and what the reads return (`payloads`: endpoint ->
    JSON; `None` for latest-change means nothing recorded, a 404)."""

    id: str
    linked: bool = True
    last_sync_at: datetime | None = None
    payloads: dict[str, Any] = field(default_factory=dict)
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class Consent:
    """A consent decision waiting for the next `/oidc/auth` request."""

    user: str
    scopes: tuple[str, ...] | None = None
    deny: bool = False


@dataclass(frozen=True, slots=True)
class ConsentRequest:
    """A validated consent request: on the consent page under the form's random id, or, once
    consented (`user` set, `scopes` those granted), an issued code kept under its hash."""

    client: str
    redirect_uri: str
    state: str | None
    scopes: tuple[str, ...]
    challenge: str | None
    expires_at: datetime
    user: str = ""


@dataclass(frozen=True, slots=True)
class UserToken:
    """A regular user access token (kept under its hash)."""

    client: str
    user: str
    scopes: tuple[str, ...]
    expires_at: datetime


@dataclass(slots=True)
class Grant:
    """A long term access of one (user, client), kept under the hash of its token."""

    user: str
    client: str
    scopes: tuple[str, ...]
    created_at: datetime
    last_used_at: datetime | None = None
    revoked: bool = False


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One request as the service saw it; never a credential, token, code or query string."""

    method: str
    path: str
    auth: AuthKind
    client: str | None
    user: str | None
    status: int | None
    code: str | None
    at: datetime
    fault: str | None = None


@dataclass(slots=True)
class World:
    """Everything the service knows; mutated only under `Simulator`'s lock."""

    clients: dict[str, Client] = field(default_factory=dict)
    users: dict[str, User] = field(default_factory=dict)
    codes: dict[str, ConsentRequest] = field(default_factory=dict)
    user_tokens: dict[str, UserToken] = field(default_factory=dict)
    grants: dict[str, Grant] = field(default_factory=dict)
    active: dict[tuple[str, str], str] = field(default_factory=dict)
    consents: deque[Consent] = field(default_factory=deque)
    consent_requests: dict[str, ConsentRequest] = field(default_factory=dict)
    budgets: dict[str, Window] = field(default_factory=dict)
    # Bounded, so that a long-running demo does not grow without end.
    log: deque[LogEntry] = field(default_factory=lambda: deque(maxlen=LOG_LIMIT))
    auto_users: int = 0

    def revoke(self, token_hash: str) -> bool:
        """Mark one grant revoked; True when it was active."""
        grant = self.grants.get(token_hash)
        if grant is None or grant.revoked:
            return False
        grant.revoked = True
        if self.active.get((grant.user, grant.client)) == token_hash:
            del self.active[(grant.user, grant.client)]
        return True

    def revoke_all(self, which: Callable[[Grant], bool]) -> int:
        """Mark every grant `which` picks revoked; the number that were active."""
        return sum(self.revoke(h) for h in [h for h, g in self.grants.items() if which(g)])

    def forget(self, token_hash: str) -> None:
        """Drop a grant entirely: its token is unknown from now on (a plain 401)."""
        grant = self.grants.pop(token_hash, None)
        if grant is not None and self.active.get((grant.user, grant.client)) == token_hash:
            del self.active[(grant.user, grant.client)]


def default_clients(
    demo_secret: str = DEMO_CLIENT_SECRET, plain_secret: str = PLAIN_CLIENT_SECRET
) -> list[Client]:
    """The two preconfigured clients: `demo-client` (mode open) and `plain-client` (not).

    Raises:
        ValueError: A secret is empty or contains a dot (it would split a credential).
    """
    for secret in (demo_secret, plain_secret):
        if not secret or "." in secret:
            raise ValueError("a client secret must be non-empty and contain no '.'")
    return [
        Client(id=DEMO_CLIENT_ID, secret=demo_secret, long_term=True),
        Client(id=PLAIN_CLIENT_ID, secret=plain_secret, long_term=False),
    ]


# -- time: every time-dependent rule reads `Clock.now()` and nothing else ----------------

DEFAULT_START = datetime(2025, 1, 1, tzinfo=UTC)


class Clock(Protocol):
    """Anything that tells the current time as an aware UTC datetime."""

    def now(self) -> datetime:
        """Return the current time (timezone-aware, UTC)."""
        ...


class SystemClock:
    """The real wall clock."""

    def now(self) -> datetime:
        """Return the current wall-clock time in UTC."""
        return datetime.now(UTC)

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that only moves when told to (tests move time instead of sleeping); safe to
    move from another thread. `start` (naive: UTC) defaults to the start of an hour."""

    def __init__(self, start: datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._now = _aware(start or DEFAULT_START)

    def now(self) -> datetime:
        """Return the clock's current time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        """Move the clock forward (or back, with a negative value) and return the new time."""
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

    def set(self, when: datetime) -> datetime:
        """Jump to `when` (naive datetimes are taken as UTC) and return it."""
        with self._lock:
            self._now = _aware(when)
            return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self.now().isoformat()})"


def _aware(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def isoformat(when: datetime) -> str:
    """Render a datetime as ISO 8601 with a `Z` suffix, the way the service's JSON does."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


# -- default payloads: realistic, opaque, the same for the same user id --------------------

_EPOCH = datetime(2024, 6, 1, tzinfo=UTC)
_ENTITIES = ("stock", "type", "accident", "location")
_ACTIONS = ("created", "updated", "deleted")
_UNITS = ("pcs", "kg", "l", "m")


def _rng(user: str, salt: str) -> random.Random:
    # Not for security: a stable seed so that one user id always yields one payload.
    seed = int.from_bytes(hashlib.sha256(f"{salt}:{user}".encode()).digest()[:8], "big")
    return random.Random(seed)


def latest_change(user: str) -> dict[str, Any]:
    """Return the default latest-change payload of `user`."""
    rng = _rng(user, "latest-change")
    entity = rng.choice(_ENTITIES)
    occurred = _EPOCH + timedelta(seconds=rng.randrange(0, 180 * 86400))
    return {
        "id": f"chg_{rng.getrandbits(48):012x}",
        "entity": entity,
        "action": rng.choice(_ACTIONS),
        "occurredAt": isoformat(occurred),
        "source": "cloud-sync",
        "data": {
            "ref": f"{entity}-{rng.randrange(1, 500)}",
            "quantity": rng.randrange(0, 1000),
            "unit": rng.choice(_UNITS),
        },
    }


def stats(user: str) -> dict[str, Any]:
    """Return the default statistics payload of `user`."""
    rng = _rng(user, "stats")
    days = rng.choice((30, 90, 365))
    end = _EPOCH + timedelta(days=rng.randrange(0, 180))
    return {
        "period": {"from": isoformat(end - timedelta(days=days)), "to": isoformat(end)},
        "totals": {
            "changes": rng.randrange(0, 5000),
            "accidents": rng.randrange(0, 20),
            "stocks": rng.randrange(0, 300),
            "types": rng.randrange(1, 40),
        },
        "devices": rng.randrange(1, 5),
        "syncs": rng.randrange(1, 2000),
    }


def default_payloads(user: str) -> dict[str, Any]:
    """Return both default payloads of `user`, keyed by endpoint."""
    return {"latest-change": latest_change(user), "stats": stats(user)}


def other_endpoint(path: str, user: str) -> dict[str, Any]:
    """A small payload for the public endpoints that accept only a regular user token."""
    rng = _rng(user, path)
    return {"items": [{"id": rng.randrange(1, 10_000)} for _ in range(3)], "next": None}
