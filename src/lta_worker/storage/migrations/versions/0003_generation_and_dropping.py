"""Lifecycle integrity: a fencing generation, the `dropping` state, schedules by class.

`users.generation` is bumped by every claim and every change made outside a pass
(enrollment, drop, forget); a pass writes its decision only while the row still has the
generation it claimed, so lifecycle commands always win over a running pass.
`dropping` is the state of a user whose drop the service has not confirmed yet: the token
is kept only to finish the DELETE, and is never read with.

`users.due_class` records which setting a user's `next_due_at` derives from (`interval`,
`parked`, `backoff`, `backoff_parked`), and `schedule_applied` the intervals last applied,
so that a changed `poll.interval` / `poll.parked_interval` reschedules users by class with
set-based UPDATEs. Existing users get their class from their state and last outcome.

On SQLite the check constraint is changed by rebuilding the table (Alembic batch mode).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from lta_worker.storage._models import UtcDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_NEW_STATES = "'active', 'parked', 'unlinked', 'rejected', 'revoked', 'dropping', 'dropped'"


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
    """Add `users.generation` and allow the state `dropping`."""
    with op.batch_alter_table("users") as batch:
        batch.add_column(
            sa.Column("generation", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
        batch.drop_constraint(op.f("ck_users_state"), type_="check")
        batch.create_check_constraint(op.f("ck_users_state"), sa.text(f"state IN ({_NEW_STATES})"))
        batch.add_column(sa.Column("due_class", sa.String(16), nullable=True))
    op.create_table(
        "schedule_applied",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("interval_s", sa.Float(), nullable=False),
        sa.Column("parked_interval_s", sa.Float(), nullable=False),
        sa.Column("applied_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_applied")),
    )
    read_before = sa.and_(
        _c.token_ciphertext.is_not(None),
        _c.next_due_at.is_not(None),
        _c.last_polled_at.is_not(None),
    )
    for due_class, where in _BACKFILL:
        op.execute(sa.update(_users).where(read_before, where).values(due_class=due_class))
