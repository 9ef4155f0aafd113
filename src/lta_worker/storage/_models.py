"""The database schema as SQLAlchemy 2.0 typed models.

The migrations under `migrations/versions/` create exactly this schema (a test compares them);
changing a model means adding a migration and bumping `migrate.HEAD_REVISION`.

Datetimes are timezone-aware UTC in and out: `UtcDateTime` stores them as `timestamptz` on
PostgreSQL and as naive UTC on SQLite, and refuses a naive datetime on the way in.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from lta_worker.domain import USER_STATES

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UtcDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime; naive in SQLite's storage, `timestamptz` on PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Convert an aware datetime to UTC (naive for SQLite); refuse a naive one."""
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("storage takes timezone-aware datetimes only (use UTC)")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Give back an aware UTC datetime whatever the backend stored."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def _in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


class Base(DeclarativeBase):
    """Declarative base holding the shared metadata and its constraint naming convention."""

    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UtcDateTime(), dict[str, Any]: JSON()}


class User(Base):
    """One enrolled user: state, encrypted token, schedule (its lease: `UserLease`)."""

    __tablename__ = "users"
    __table_args__ = (
        CheckConstraint(f"state IN ({_in(USER_STATES)})", name="state"),
        CheckConstraint(
            "(token_ciphertext IS NULL) = (token_key_id IS NULL)", name="token_and_key"
        ),
        # Partial: counting and claiming due users both ask for a token held by a user who
        # is not `dropping` (migrations 0002 and 0006).
        Index(
            "ix_users_due",
            "next_due_at",
            "id",
            sqlite_where=text("token_ciphertext IS NOT NULL AND state != 'dropping'"),
            postgresql_where=text("token_ciphertext IS NOT NULL AND state != 'dropping'"),
        ),
        Index("ix_users_state", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(String(255), unique=True)
    state: Mapped[str] = mapped_column(String(16))
    token_ciphertext: Mapped[bytes | None] = mapped_column(LargeBinary)
    token_key_id: Mapped[str | None] = mapped_column(String(64))
    scopes: Mapped[list[str]] = mapped_column(JSON)
    denied: Mapped[dict[str, Any]] = mapped_column(JSON)
    enrolled_at: Mapped[datetime | None]
    last_polled_at: Mapped[datetime | None]
    next_due_at: Mapped[datetime | None]
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    last_outcome: Mapped[str | None] = mapped_column(String(32))
    last_code: Mapped[str | None] = mapped_column(String(64))
    revoked_at: Mapped[datetime | None]
    dropped_at: Mapped[datetime | None]
    # The fencing token (migration 0003): see `records.UserRow.generation`. While the user
    # is leased, its lease's generation is the current one (`UserLease`, migration 0007).
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # Which setting next_due_at derives from (migration 0003): see `policy.DUE_CLASSES`.
    due_class: Mapped[str | None] = mapped_column(String(16))
    # The freshness estimate and its log-scale rates (migration 0004): `ChangeEstimate`.
    estimate: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    plan_bucket: Mapped[int | None] = mapped_column(Integer)
    rate_bucket: Mapped[int | None] = mapped_column(Integer)


class UserLease(Base):
    """A pass's lease on a user (migration 0007): no row, no lease.

    Apart from `users`, so that claiming a batch inserts a few small rows instead of
    rewriting every page of the big table that holds a claimed user. `generation` is the
    fencing token of the claim; it goes back into `users.generation` when the lease ends.
    """

    __tablename__ = "user_leases"
    __table_args__ = (Index("ix_user_leases_owner", "owner"),)

    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    owner: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime]
    generation: Mapped[int] = mapped_column(Integer)


class Snapshot(Base):
    """The latest result of one (user, endpoint)."""

    __tablename__ = "snapshots"
    __table_args__ = (CheckConstraint("status IN ('ok', 'none')", name="status"),)

    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )
    endpoint: Mapped[str] = mapped_column(String(32), primary_key=True)
    status: Mapped[str] = mapped_column(String(8))
    payload: Mapped[Any | None] = mapped_column(JSON(none_as_null=True))
    content_hash: Mapped[str] = mapped_column(String(64))
    fetched_at: Mapped[datetime]
    changed_at: Mapped[datetime]


class History(Base):
    """Every distinct content a (user, endpoint) had, appended when the content hash changed."""

    __tablename__ = "history"
    __table_args__ = (
        CheckConstraint("status IN ('ok', 'none')", name="status"),
        Index("ix_history_user_id_endpoint_fetched_at", "user_id", "endpoint", "fetched_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    endpoint: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(8))
    payload: Mapped[Any | None] = mapped_column(JSON(none_as_null=True))
    content_hash: Mapped[str] = mapped_column(String(64))
    fetched_at: Mapped[datetime]


class PendingEnrollmentRow(Base):
    """A started consent, keyed by the sha256 of its OAuth state (never the state itself)."""

    __tablename__ = "pending_enrollments"
    __table_args__ = (Index("ix_pending_enrollments_expires_at", "expires_at"),)

    state_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(String(255))
    verifier_ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    verifier_key_id: Mapped[str] = mapped_column(String(64))
    redirect_uri: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None]


class Instance(Base):
    """A live (or recently live) lta-worker process."""

    __tablename__ = "instances"
    __table_args__ = (CheckConstraint("kind IN ('run', 'serve')", name="kind"),)

    instance_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(8))
    started_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime]


class ScheduleApplied(Base):
    """The intervals the users' due times were last computed with (one row, migration 0003)."""

    __tablename__ = "schedule_applied"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    interval_s: Mapped[float] = mapped_column(Float)
    parked_interval_s: Mapped[float] = mapped_column(Float)
    applied_at: Mapped[datetime]


class ClientBudget(Base):
    """The client's rate budget as last reported, and permits handed out since."""

    __tablename__ = "client_budget"

    client_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    limit: Mapped[int | None] = mapped_column(Integer)
    remaining: Mapped[int | None] = mapped_column(Integer)
    reset_at: Mapped[datetime | None]
    window_seconds: Mapped[float | None] = mapped_column(Float)
    observed_at: Mapped[datetime]
    reserved: Mapped[int] = mapped_column(Integer, default=0)


class Pass(Base):
    """The summary of one pass."""

    __tablename__ = "passes"
    __table_args__ = (Index("ix_passes_finished_at", "finished_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    instance: Mapped[str] = mapped_column(String(128))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]
    stopped: Mapped[str] = mapped_column(String(32))
    exit_code: Mapped[int] = mapped_column(Integer)
    reads: Mapped[int] = mapped_column(Integer)
    throttled: Mapped[int] = mapped_column(Integer)
    counts: Mapped[dict[str, Any]] = mapped_column(JSON)


class OutboxEvent(Base):
    """A user state change waiting for its webhook delivery (migration 0005).

    Written in the same transaction as the change; deleted once the receiver acknowledged
    it; kept with `dead_at` set when it grew older than `webhook.max_age` undelivered.
    """

    __tablename__ = "webhook_outbox"
    __table_args__ = (
        Index("ix_webhook_outbox_user_id", "user", "id"),
        Index("ix_webhook_outbox_next_attempt_at", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(64), unique=True)
    user: Mapped[str] = mapped_column(String(255))
    type: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime]
    next_attempt_at: Mapped[datetime]
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(String(200))
    dead_at: Mapped[datetime | None]
    # The instance delivering it now (until `next_attempt_at`); NULL when none.
    lease_owner: Mapped[str | None] = mapped_column(String(128))
