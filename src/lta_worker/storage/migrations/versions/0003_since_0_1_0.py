"""Everything since 0.1.0 (0002), in one step; the tables are described in `storage._models`.

Data a 0.1.0 database holds moves along: live leases go from `users` to `user_leases` (with
generation 0, the one every user starts with), existing users get their `due_class` from
their state and last outcome, and the feed gets its one row and a random history id.
On SQLite the users table is rebuilt once (Alembic batch mode: a check constraint changes).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op

from lta_worker.storage._models import UtcDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_STATES = "'active', 'parked', 'unlinked', 'rejected', 'revoked', 'dropping', 'dropped'"
_DUE = sa.text("token_ciphertext IS NOT NULL AND state != 'dropping'")
_HELD = sa.text("token_ciphertext IS NOT NULL")

_users = sa.table(
    "users",
    sa.column("state", sa.String),
    sa.column("token_ciphertext", sa.LargeBinary),
    sa.column("next_due_at", UtcDateTime),
    sa.column("last_polled_at", UtcDateTime),
    sa.column("last_outcome", sa.String),
    sa.column("due_class", sa.String),
)
_c = _users.c
_BACKFILL = (
    ("interval", sa.and_(_c.state == "active", _c.last_outcome.in_(["ok", "none"]))),
    ("parked", _c.state.in_(["parked", "unlinked"])),
    ("backoff", _c.last_outcome == "transient"),
    ("backoff_parked", _c.state == "rejected"),
)


def upgrade() -> None:
    """Take a 0.1.0 schema to this one."""
    op.create_table(
        "user_leases",
        sa.Column("user_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_user_leases")),
    )
    op.create_index("ix_user_leases_owner", "user_leases", ["owner"])
    op.execute(
        "INSERT INTO user_leases (user_id, owner, expires_at, generation) "
        "SELECT id, lease_owner, lease_expires_at, 0 FROM users "
        "WHERE lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL"
    )
    op.drop_index("ix_users_lease_owner", table_name="users")
    op.drop_index("ix_users_due", table_name="users")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("lease_expires_at")
        batch.drop_column("lease_owner")
        batch.add_column(
            sa.Column("generation", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
        batch.drop_constraint(op.f("ck_users_state"), type_="check")
        batch.create_check_constraint(op.f("ck_users_state"), sa.text(f"state IN ({_STATES})"))
        batch.add_column(sa.Column("due_class", sa.String(16), nullable=True))
        batch.add_column(sa.Column("estimate", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("plan_bucket", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("rate_bucket", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("forgotten_at", UtcDateTime(), nullable=True))
    op.create_index(
        "ix_users_due", "users", ["next_due_at", "id"], sqlite_where=_DUE, postgresql_where=_DUE
    )
    cols = ["state", "plan_bucket", "rate_bucket"]  # the plan's count per rate bucket
    op.create_index("ix_users_buckets", "users", cols, sqlite_where=_HELD, postgresql_where=_HELD)
    op.create_index("ix_users_polled", "users", ["last_polled_at"])
    read_before = sa.and_(
        _c.token_ciphertext.is_not(None),
        _c.next_due_at.is_not(None),
        _c.last_polled_at.is_not(None),
    )
    for due_class, where in _BACKFILL:
        op.execute(sa.update(_users).where(read_before, where).values(due_class=due_class))
    op.create_table(
        "schedule_applied",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("interval_s", sa.Float(), nullable=False),
        sa.Column("parked_interval_s", sa.Float(), nullable=False),
        sa.Column("applied_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_applied")),
    )
    op.create_table(
        "webhook_outbox",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("next_attempt_at", UtcDateTime(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_error", sa.String(200), nullable=True),
        sa.Column("dead_at", UtcDateTime(), nullable=True),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_outbox")),
        sa.UniqueConstraint("event_id", name=op.f("uq_webhook_outbox_event_id")),
    )
    op.create_index("ix_webhook_outbox_user_id", "webhook_outbox", ["user", "id"])
    op.create_index("ix_webhook_outbox_next_attempt_at", "webhook_outbox", ["next_attempt_at"])
    # Rows stored before the feed existed get seq 0, so a cursor of 0 still returns them.
    op.add_column(
        "history", sa.Column("seq", sa.BigInteger(), server_default=sa.text("0"), nullable=False)
    )
    op.create_index("ix_history_seq", "history", ["seq", "id"])
    counter = op.create_table(
        "feed_counter",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.Column("history_id", sa.String(32), nullable=True),
        sa.Column("pg_system", sa.String(32), nullable=True),
        sa.Column("pg_offset", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feed_counter")),
    )
    op.bulk_insert(counter, [{"id": 1, "value": 0, "history_id": secrets.token_hex(8)}])
    op.create_table(
        "feed_gone",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feed_gone")),
    )
    op.create_index("ix_feed_gone_seq", "feed_gone", ["seq", "id"])
