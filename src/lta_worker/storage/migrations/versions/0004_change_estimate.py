"""The freshness schedule's per-user change estimate.

`users.estimate` (JSON) holds what the reads observed of the user's changes: decayed
changes and observed time per slice of the day, the content hash of the last latest-change
answer, when it was read and when stats was last read (`domain.ChangeEstimate`).
`users.plan_bucket` and `users.rate_bucket` are its planning rate and mean rate on a log
scale, so that a pass plans the budget with one GROUP BY instead of reading every estimate.
All three are NULL until the user's next read.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the estimate columns (nullable: filled at each user's next read)."""
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("estimate", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("plan_bucket", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("rate_bucket", sa.Integer(), nullable=True))
