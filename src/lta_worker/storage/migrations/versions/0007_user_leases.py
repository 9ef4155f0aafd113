"""Leases move from `users` to their own small table, `user_leases`.

A claim wrote `lease_owner`, `lease_expires_at` and `generation` into every claimed user's
row: due order is not id order, so a claim of 1,000 users out of a million rewrote about
1,000 pages of `users` and as many of `ix_users_lease_owner` (2,000 WAL pages, 8 MB, per
claim on SQLite: 62 ms of SQL and commit in bench B3). A claim now inserts its leases into
`user_leases` (about 20 pages) and leaves `users` alone; the lease's generation is the
claim's fencing token, written back into `users.generation` when the lease ends.

Live leases are carried over with the generation their claim gave the row. On SQLite the
columns are dropped with `ALTER TABLE ... DROP COLUMN` (SQLite 3.35, which the claim's
RETURNING already needs), which rewrites the table once.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from lta_worker.storage._models import UtcDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create `user_leases`, move the live leases into it, drop the lease columns."""
    op.create_table(
        "user_leases",
        sa.Column("user_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_user_leases_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_user_leases")),
    )
    op.create_index("ix_user_leases_owner", "user_leases", ["owner"])
    op.execute(
        "INSERT INTO user_leases (user_id, owner, expires_at, generation) "
        "SELECT id, lease_owner, lease_expires_at, generation FROM users "
        "WHERE lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL"
    )
    op.drop_index("ix_users_lease_owner", table_name="users")
    op.drop_column("users", "lease_expires_at")
    op.drop_column("users", "lease_owner")
