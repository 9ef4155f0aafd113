"""The feed's identity, its forget lines, and what a forget leaves.

- `feed_counter` gets `history_id` (a random id: every cursor carries it, so a cursor of
  another database is refused), `pg_system` and `pg_offset` (PostgreSQL: the cluster whose
  transaction ids the feed counts, and what is added to them; see `storage._feed`).
- `feed_gone`: a line of the change feed per user whose results were purged (`users
  forget`, the retention purge), so that a feed consumer learns the data is gone.
- `users.forgotten_at`: when the user was last forgotten; enrollment links issued before it
  are refused.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op

from lta_worker.storage._models import UtcDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the columns and the table; give the feed its identity."""
    with op.batch_alter_table("feed_counter") as batch:
        batch.add_column(sa.Column("history_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("pg_system", sa.String(32), nullable=True))
        batch.add_column(
            sa.Column("pg_offset", sa.BigInteger(), server_default=sa.text("0"), nullable=False)
        )
    op.execute(
        sa.text("UPDATE feed_counter SET history_id = :id").bindparams(id=secrets.token_hex(8))
    )
    op.add_column("users", sa.Column("forgotten_at", UtcDateTime(), nullable=True))
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
