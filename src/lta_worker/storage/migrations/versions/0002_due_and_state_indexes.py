"""Indexes that keep `status` and claims fast on a million users (bench/ B3): `ix_users_due`
becomes partial (users holding a token), and `ix_users_state` counts users per state.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_HOLDS_TOKEN = sa.text("token_ciphertext IS NOT NULL")


def upgrade() -> None:
    """Make the due index partial and add the per-state index."""
    op.drop_index("ix_users_due", table_name="users")
    op.create_index(
        "ix_users_due",
        "users",
        ["next_due_at", "id"],
        sqlite_where=_HOLDS_TOKEN,
        postgresql_where=_HOLDS_TOKEN,
    )
    op.create_index("ix_users_state", "users", ["state"])
