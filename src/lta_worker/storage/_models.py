"""The schema as SQLAlchemy Core tables that read like ORM models without importing the
ORM (about 100 ms at start); the migrations create exactly this (a test compares them).
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from typing import Any, ClassVar, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    text,
)
from sqlalchemy.schema import SchemaItem
from sqlalchemy.sql.elements import ColumnClause
from sqlalchemy.types import TypeEngine

from lta_worker.domain import USER_STATES

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
METADATA = MetaData(naming_convention=NAMING)
T = TypeVar("T")
_STATES_SQL = ", ".join(f"'{state}'" for state in USER_STATES)


class UtcDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime; naive in SQLite's storage, `timestamptz` on PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """To UTC (naive for SQLite); a naive datetime is refused."""
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


def column(
    type_: TypeEngine[T] | type[TypeEngine[T]], *args: SchemaItem, **kwargs: Any
) -> ColumnClause[T]:
    """A `Column`, typed as the expression it is in a query (mypy's `Column` on a class is not)."""
    return Column(type_, *args, **kwargs)


def _when(nullable: bool = False) -> ColumnClause[datetime]:
    return column(UtcDateTime(), nullable=nullable)


class Base:
    """A table: its columns as class attributes, its `Table` in `__table__` (in `METADATA`)."""

    metadata: ClassVar[MetaData] = METADATA
    __tablename__: ClassVar[str]
    __table__: ClassVar[Table]
    __table_args__: ClassVar[tuple[SchemaItem, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        columns: list[Column[Any]] = []
        for name, value in vars(cls).items():
            if isinstance(value, Column):
                value.name = value.key = name
                columns.append(value)
        cls.__table__ = Table(cls.__tablename__, METADATA, *columns, *cls.__table_args__)

    @classmethod
    def __clause_element__(cls) -> Table:
        """The table, wherever a statement takes one (`select(User)`, `update(User)`)."""
        return cls.__table__


class User(Base):
    """One enrolled user: state, encrypted token, schedule (its lease: `UserLease`)."""

    __tablename__ = "users"
    __table_args__ = (
        CheckConstraint(f"state IN ({_STATES_SQL})", name="state"),
        CheckConstraint(
            "(token_ciphertext IS NULL) = (token_key_id IS NULL)", name="token_and_key"
        ),
        # The partial due index is added by `schema_metadata` (see there).
        Index("ix_users_state", "state"),
        Index("ix_users_polled", "last_polled_at"),  # the latest read, for `read_health`
    )

    id = column(Integer, primary_key=True, autoincrement=True)
    user = column(String(255), nullable=False, unique=True)
    state = column(String(16), nullable=False)
    token_ciphertext = column(LargeBinary)
    token_key_id = column(String(64))
    scopes = column(JSON, nullable=False)
    denied = column(JSON, nullable=False)
    enrolled_at = _when(nullable=True)
    last_polled_at = _when(nullable=True)
    next_due_at = _when(nullable=True)
    consecutive_failures = column(Integer, nullable=False, default=0)
    last_outcome = column(String(32))
    last_code = column(String(64))
    revoked_at = _when(nullable=True)
    dropped_at = _when(nullable=True)
    # The fencing token (`UserRow.generation`); while leased, the lease's is the current one.
    generation = column(Integer, nullable=False, default=0, server_default=text("0"))
    # Which setting next_due_at derives from: `policy.DUE_CLASSES`.
    due_class = column(String(16))
    # The freshness estimate and its log-scale rates: `ChangeEstimate`.
    estimate = column(JSON)
    plan_bucket = column(Integer)
    rate_bucket = column(Integer)
    # When the user was last forgotten: links issued before it are refused.
    forgotten_at = _when(nullable=True)


class UserLease(Base):
    """A pass's lease on a user (no row, no lease): `storage._leases`."""

    __tablename__ = "user_leases"
    __table_args__ = (Index("ix_user_leases_owner", "owner"),)

    # No foreign key: a lease is only written for a user row its transaction holds, and no
    # user row is ever deleted; the key's check cost a third of a PostgreSQL claim.
    user_id = column(Integer, primary_key=True, autoincrement=False)
    owner = column(String(128), nullable=False)
    expires_at = _when()
    generation = column(Integer, nullable=False)


class Snapshot(Base):
    """The latest result of one (user, endpoint)."""

    __tablename__ = "snapshots"
    __table_args__ = (CheckConstraint("status IN ('ok', 'none')", name="status"),)

    user_id = column(Integer, ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    endpoint = column(String(32), primary_key=True)
    status = column(String(8), nullable=False)
    payload = column(JSON(none_as_null=True))
    content_hash = column(String(64), nullable=False)
    fetched_at = _when()
    changed_at = _when()


class History(Base):
    """Every distinct content a (user, endpoint) had; `seq` orders the feed (`_feed`)."""

    __tablename__ = "history"
    __table_args__ = (
        CheckConstraint("status IN ('ok', 'none')", name="status"),
        Index("ix_history_user_id_endpoint_fetched_at", "user_id", "endpoint", "fetched_at"),
        Index("ix_history_seq", "seq", "id"),
    )

    id = column(Integer, primary_key=True, autoincrement=True)
    user_id = column(Integer, ForeignKey("users.id", ondelete="CASCADE"), nullable=False)
    endpoint = column(String(32), nullable=False)
    status = column(String(8), nullable=False)
    payload = column(JSON(none_as_null=True))
    content_hash = column(String(64), nullable=False)
    fetched_at = _when()
    seq = column(BigInteger, nullable=False, default=0, server_default=text("0"))


class FeedCounter(Base):
    """The feed's one row: its identity, SQLite's counter, PostgreSQL's offset (`_feed`)."""

    __tablename__ = "feed_counter"

    id = column(Integer, primary_key=True, autoincrement=False)
    value = column(BigInteger, nullable=False)
    history_id = column(String(32))
    pg_system = column(String(32))
    pg_offset = column(BigInteger, nullable=False, default=0, server_default=text("0"))


class FeedGone(Base):
    """A feed line saying a user's results are gone (`users forget`, the retention purge)."""

    __tablename__ = "feed_gone"
    __table_args__ = (Index("ix_feed_gone_seq", "seq", "id"),)

    id = column(Integer, primary_key=True, autoincrement=True)
    user = column(String(255), nullable=False)
    seq = column(BigInteger, nullable=False)
    reason = column(String(16), nullable=False)
    at = _when()


class PendingEnrollmentRow(Base):
    """A started consent, keyed by the sha256 of its OAuth state (never the state itself)."""

    __tablename__ = "pending_enrollments"
    __table_args__ = (Index("ix_pending_enrollments_expires_at", "expires_at"),)

    state_hash = column(String(64), primary_key=True)
    user = column(String(255), nullable=False)
    verifier_ciphertext = column(LargeBinary, nullable=False)
    verifier_key_id = column(String(64), nullable=False)
    redirect_uri = column(Text, nullable=False)
    created_at = _when()
    expires_at = _when()
    used_at = _when(nullable=True)


class Instance(Base):
    """A live (or recently live) lta-worker process."""

    __tablename__ = "instances"
    __table_args__ = (CheckConstraint("kind IN ('run', 'serve')", name="kind"),)

    instance_id = column(String(128), primary_key=True)
    host = column(String(255), nullable=False)
    pid = column(Integer, nullable=False)
    kind = column(String(8), nullable=False)
    started_at = _when()
    heartbeat_at = _when()


class ScheduleApplied(Base):
    """The intervals the users' due times were last computed with (one row)."""

    __tablename__ = "schedule_applied"

    id = column(Integer, primary_key=True)
    interval_s = column(Float, nullable=False)
    parked_interval_s = column(Float, nullable=False)
    applied_at = _when()


class ClientBudget(Base):
    """The client's rate budget as last reported, and permits handed out since."""

    __tablename__ = "client_budget"

    client_id = column(String(255), primary_key=True)
    limit = column(Integer)
    remaining = column(Integer)
    reset_at = _when(nullable=True)
    window_seconds = column(Float)
    observed_at = _when()
    reserved = column(Integer, nullable=False, default=0)


class Pass(Base):
    """The summary of one pass."""

    __tablename__ = "passes"
    __table_args__ = (Index("ix_passes_finished_at", "finished_at"),)

    id = column(Integer, primary_key=True, autoincrement=True)
    instance = column(String(128), nullable=False)
    started_at = _when()
    finished_at = _when()
    stopped = column(String(32), nullable=False)
    exit_code = column(Integer, nullable=False)
    reads = column(Integer, nullable=False)
    throttled = column(Integer, nullable=False)
    counts = column(JSON, nullable=False)


class OutboxEvent(Base):
    """A user state change waiting for its webhook delivery (`storage._outbox`)."""

    __tablename__ = "webhook_outbox"
    __table_args__ = (
        Index("ix_webhook_outbox_user_id", "user", "id"),
        Index("ix_webhook_outbox_next_attempt_at", "next_attempt_at"),
    )

    id = column(Integer, primary_key=True, autoincrement=True)
    event_id = column(String(64), nullable=False, unique=True)
    user = column(String(255), nullable=False)
    type = column(String(32), nullable=False)
    payload = column(JSON, nullable=False)
    created_at = _when()
    next_attempt_at = _when()
    attempts = column(Integer, nullable=False, default=0, server_default=text("0"))
    last_error = column(String(200))
    dead_at = _when(nullable=True)
    # The instance delivering it now (until `next_attempt_at`); NULL when none.
    lease_owner = column(String(128))


@cache
def schema_metadata() -> MetaData:
    """The whole schema, for the migrations and the schema test, with the partial indexes.

    They are declared here only: their per-dialect conditions load PostgreSQL's dialect
    (about 45 ms), which a command on SQLite would pay at start.
    """
    due = text("token_ciphertext IS NOT NULL AND state != 'dropping'")
    Index("ix_users_due", User.next_due_at, User.id, sqlite_where=due, postgresql_where=due)
    held = text("token_ciphertext IS NOT NULL")  # the plan's count per rate bucket
    buckets = User.state, User.plan_bucket, User.rate_bucket
    Index("ix_users_buckets", *buckets, sqlite_where=held, postgresql_where=held)
    return METADATA
