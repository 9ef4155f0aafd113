"""The change feed: `history.seq` and SQLite's `feed_counter`.

`results export --changed-since CURSOR` returns the history rows stored after a cursor.
A row id cannot be that cursor: on PostgreSQL a transaction that took a smaller id may
commit after one that took a larger id (a reader past the larger one would never see the
smaller), and SQLite reuses the largest row id once its row is deleted. `seq` is the
number of the transaction that wrote the row instead (see `storage._feed`); rows written
before this migration get 0, so a cursor of 0 still returns them.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add `history.seq` and its index; create `feed_counter` with its one row."""
    op.add_column(
        "history",
        sa.Column("seq", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.create_index("ix_history_seq", "history", ["seq", "id"])
    counter = op.create_table(
        "feed_counter",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feed_counter")),
    )
    op.bulk_insert(counter, [{"id": 1, "value": 0}])
