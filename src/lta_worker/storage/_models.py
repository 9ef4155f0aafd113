"""The database schema as SQLAlchemy 2.0 Core tables, one class per table.

The migrations under `migrations/versions/` create exactly this schema (a test compares them);
changing a table means adding a migration and bumping `migrate.HEAD_REVISION`.

Each class declares its columns and builds its `Table` (`__table__`); `User.state` is the
users table's column and `select(User)` selects the table (`__clause_element__`), so the
queries read as they would over ORM models, but nothing here imports the ORM: every query is
Core, and `status` or a `run` with nothing due never pays for `sqlalchemy.orm` (about 50 ms
to import, and as much again to map the classes).

Datetimes are timezone-aware UTC in and out: `UtcDateTime` stores them as `timestamptz` on
PostgreSQL and as naive UTC on SQLite, and refuses a naive datetime on the way in.
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


def column(
    type_: TypeEngine[T] | type[TypeEngine[T]], *args: SchemaItem, **kwargs: Any
) -> ColumnClause[T]:
    """A column of a table class (`Column`; typed as the expression it is in a query: a
    `Column` read from a class is typed as unusable, the ORM's guard of its own classes)."""
    return Column(type_, *args, **kwargs)


def _when(nullable: bool = False) -> ColumnClause[datetime]:
    """A UTC datetime column."""
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
        CheckConstraint(f"state IN ({_in(USER_STATES)})", name="state"),
        CheckConstraint(
            "(token_ciphertext IS NULL) = (token_key_id IS NULL)", name="token_and_key"
        ),
        # The partial due index is added by `schema_metadata` (see there).
        Index("ix_users_state", "state"),
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
    # The fencing token (migration 0003): see `records.UserRow.generation`. While the user
    # is leased, its lease's generation is the current one (`UserLease`, migration 0007).
    generation = column(Integer, nullable=False, default=0, server_default=text("0"))
    # Which setting next_due_at derives from (migration 0003): see `policy.DUE_CLASSES`.
    due_class = column(String(16))
    # The freshness estimate and its log-scale rates (migration 0004): `ChangeEstimate`.
    estimate = column(JSON)
    plan_bucket = column(Integer)
    rate_bucket = column(Integer)
    # When the user was last forgotten (migration 0010): links issued before it are refused.
    forgotten_at = _when(nullable=True)


class UserLease(Base):
    """A pass's lease on a user (migration 0007): no row, no lease.

    Apart from `users`, so that claiming a batch inserts a few small rows instead of
    rewriting every page of the big table that holds a claimed user. `generation` is the
    fencing token of the claim; it goes back into `users.generation` when the lease ends.
    """

    __tablename__ = "user_leases"
    __table_args__ = (Index("ix_user_leases_owner", "owner"),)

    # A user's id, without a foreign key (migration 0009): a lease is only written for a
    # user row its transaction holds, and no user row is ever deleted.
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
    """Every distinct content a (user, endpoint) had, appended when the content hash changed.

    `seq` (migration 0008) orders the rows for the change feed (`storage._feed`): the
    number of the transaction that wrote them (PostgreSQL's transaction id; on SQLite, the
    counter in `feed_counter`), 0 for rows written before it existed.
    """

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
    """The feed's one row (migration 0008): its identity and SQLite's counter.

    SQLite has no transaction id: each write that appends history takes the next `value`,
    under the database's one write lock, so values follow commit order and never repeat
    (a row id would: SQLite reuses the largest one once its row is deleted). PostgreSQL's
    transaction ids serve instead, plus `pg_offset`, counted on the cluster `pg_system`
    (migration 0010). `history_id` names this database's history in every cursor.
    """

    __tablename__ = "feed_counter"

    id = column(Integer, primary_key=True, autoincrement=False)
    value = column(BigInteger, nullable=False)
    history_id = column(String(32))
    pg_system = column(String(32))
    pg_offset = column(BigInteger, nullable=False, default=0, server_default=text("0"))


class FeedGone(Base):
    """A line of the feed saying a user's results are gone (`users forget`, the retention
    purge; migration 0010), numbered like the history rows (`seq`)."""

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
    """The intervals the users' due times were last computed with (one row, migration 0003)."""

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
    """A user state change waiting for its webhook delivery (migration 0005).

    Written in the same transaction as the change; deleted once the receiver acknowledged
    it; kept with `dead_at` set when it grew older than `webhook.max_age` undelivered.
    """

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
    """The whole schema, for the migrations' environment and the schema test.

    It adds the one index the queries do not need to know of: `ix_users_due`, partial
    (counting and claiming due users both ask for a token held by a user who is not
    `dropping`, migrations 0002 and 0006). Its condition is given per dialect, and
    declaring it loads every dialect named, PostgreSQL's among them (about 45 ms), which a
    command on SQLite would otherwise pay at each start.
    """
    due = text("token_ciphertext IS NOT NULL AND state != 'dropping'")
    Index("ix_users_due", User.next_due_at, User.id, sqlite_where=due, postgresql_where=due)
    return METADATA
