"""Plain records that cross the storage boundary: what the engine, CLI and enrollment see."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, get_args

from lta_worker.domain._estimate import ChangeEstimate
from lta_worker.domain._outcomes import answered_reads
from lta_worker.protocol import ENDPOINT_SCOPES, ENDPOINTS, LONG_TERM_SCOPES, Endpoint

# The protocol's endpoints and scopes, re-exported.
__all__ = ["ENDPOINTS", "ENDPOINT_SCOPES", "LONG_TERM_SCOPES", "Endpoint"]

UserState = Literal["active", "parked", "unlinked", "rejected", "revoked", "dropping", "dropped"]
USER_STATES: Final[tuple[UserState, ...]] = get_args(UserState)
TOKENLESS_STATES: Final[frozenset[UserState]] = frozenset({"revoked", "dropped"})
# States a pass never reads: no token, or (dropping) a token kept only to finish the DELETE.
UNREAD_STATES: Final[frozenset[UserState]] = TOKENLESS_STATES | {"dropping"}


ResultStatus = Literal["ok", "none"]


@dataclass(frozen=True, slots=True)
class EncryptedToken:
    """A secret (token or PKCE verifier) as stored: AES-GCM ciphertext and the key id used."""

    ciphertext: bytes
    key_id: str

    def __repr__(self) -> str:
        return f"EncryptedToken(key_id={self.key_id!r}, {len(self.ciphertext)} bytes)"


@dataclass(frozen=True, slots=True)
class UserRow:
    """One enrolled user as the engine and the CLI see it."""

    id: int
    user: str
    state: UserState
    token: EncryptedToken | None
    scopes: tuple[str, ...]
    denied: Mapping[str, datetime]
    enrolled_at: datetime | None
    last_polled_at: datetime | None
    next_due_at: datetime | None
    consecutive_failures: int
    last_outcome: str | None
    last_code: str | None
    # Bumped by every claim and every change made outside a pass (enrollment, drop,
    # forget): a pass's decision is written only while the row still has the generation
    # it claimed (the fencing token).
    generation: int = 0
    # What the reads observed of the user's changes (`freshness`); None: nothing yet.
    estimate: ChangeEstimate | None = None

    def granted(self, endpoint: Endpoint) -> bool:
        """True when the user granted the scope of this endpoint at enrollment."""
        return ENDPOINT_SCOPES[endpoint] in self.scopes


@dataclass(frozen=True, slots=True)
class SnapshotWrite:
    """One read's result to store: `ok` with the payload as received, or `none` (404)."""

    endpoint: Endpoint
    status: ResultStatus
    payload: Any
    fetched_at: datetime
    # The payload's canonical JSON when the caller has it (`Outcome.content`), so that
    # storage does not serialise it again to hash it.
    content: bytes | None = None


@dataclass(frozen=True, slots=True)
class UserUpdate:
    """Everything one user's turn changes, written in one transaction with the others.

    Idempotent: applying the same update twice leaves the database as after once.
    `delete_token` clears ciphertext and key id in the same transaction as the state change.
    """

    user_id: int
    state: UserState
    next_due_at: datetime | None
    consecutive_failures: int
    last_outcome: str
    last_code: str | None = None
    last_polled_at: datetime | None = None
    delete_token: bool = False
    denied: Mapping[str, datetime] = field(default_factory=dict)
    snapshots: tuple[SnapshotWrite, ...] = ()
    # The generation the pass claimed; with it, the update is written only while the row
    # still has that generation (None: unfenced, for tools and tests).
    generation: int | None = None
    # Which setting `next_due_at` derives from (`policy.DUE_CLASSES`), so that a changed
    # interval reschedules the user; None: not derived from a setting.
    due_class: str | None = None
    # The change estimate after this turn (`freshness`); None: leave the stored one.
    estimate: ChangeEstimate | None = None


@dataclass(frozen=True, slots=True)
class ResultRow:
    """The latest stored result of one (user, endpoint), as exported."""

    user: str
    endpoint: Endpoint
    status: ResultStatus
    payload: Any
    fetched_at: datetime
    changed_at: datetime
    # The user's state now: revoked and dropped users' results are recognisable.
    state: UserState = "active"


@dataclass(frozen=True, slots=True)
class UserForgotten:
    """A line of the change feed: every stored result of `user` is gone, `at` that time
    (`reason`: `forget`, by `users forget`; `retention`, by the retention purge)."""

    user: str
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class ChangeFeed:
    """The results stored after a cursor (`rows`, in the order stored, with a
    `UserForgotten` where a user's results were purged) and the cursor to pass next time
    (opaque: this database's history id and a position in it): every later result is
    after it, no earlier one is."""

    cursor: str
    rows: Iterator[ResultRow | UserForgotten]


@dataclass(frozen=True, slots=True)
class PendingEnrollment:
    """A started consent: who it is for, its PKCE verifier (encrypted) and when it expires."""

    user: str
    verifier: EncryptedToken
    redirect_uri: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class PassRecord:
    """The summary of one pass, for `status`."""

    instance: str
    started_at: datetime
    finished_at: datetime
    stopped: str
    exit_code: int
    reads: int
    throttled: int
    counts: Mapping[str, int]

    @property
    def answered(self) -> int:
        """Its reads the service answered (`ANSWERED_KINDS`); none proves nothing of the service."""
        return answered_reads(self.counts, self.stopped)


@dataclass(frozen=True, slots=True)
class ReadHealth:
    """What the users' last reads say of the service, for the health verdict: when the
    latest answered read was made, and how many users' last read failed after that.

    From the users' rows, not pass summaries: a pass that finds nobody due changes neither,
    and both outlive a restart.
    """

    last_answered_at: datetime | None
    failing: int


@dataclass(frozen=True, slots=True)
class BudgetSeen:
    """What the service last reported about the client's budget."""

    limit: int | None
    remaining: int | None
    reset_at: datetime | None
    window_seconds: float | None
    observed_at: datetime


@dataclass(frozen=True, slots=True)
class PurgeCounts:
    """What a retention purge removed."""

    users: int = 0
    snapshots: int = 0
    history: int = 0
    pending: int = 0
    # Past contents older than `retention.history` (of any user; the newest kept).
    history_pruned: int = 0


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One past content of a (user, endpoint): appended only when the content changed."""

    endpoint: Endpoint
    status: ResultStatus
    payload: Any
    content_hash: str
    fetched_at: datetime


InstanceKind = Literal["run", "serve"]


@dataclass(frozen=True, slots=True)
class InstanceRow:
    """One registered lta-worker process (several share a PostgreSQL database)."""

    instance: str
    host: str
    pid: int
    kind: InstanceKind
    started_at: datetime
    heartbeat_at: datetime


@dataclass(frozen=True, slots=True)
class RotationReport:
    """What `keys rotate` did: secrets re-encrypted, already under the newest key, failed."""

    key_id: str
    rotated: int = 0
    already_current: int = 0
    failed: int = 0
