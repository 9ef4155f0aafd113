"""The webhook outbox: user state changes waiting for their delivery.

`webhook_outbox` gets a row in the same transaction as every user state change
(`storage._outbox`); the delivery deletes it once the receiver acknowledged it, or marks it
dead (`dead_at`) when it grew older than `webhook.max_age`. Rows are delivered in `id` order
per user (`ix_webhook_outbox_user_id`).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from lta_worker.storage._models import UtcDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create `webhook_outbox` and its indexes."""
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
