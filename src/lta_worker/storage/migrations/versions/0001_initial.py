"""Initial schema: users, snapshots, history, pending enrollments, instances, budget, passes.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from lta_worker.storage._models import UtcDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_STATES = "'active', 'parked', 'unlinked', 'rejected', 'revoked', 'dropped'"


def upgrade() -> None:
    """Create every table."""
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("token_ciphertext", sa.LargeBinary(), nullable=True),
        sa.Column("token_key_id", sa.String(64), nullable=True),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("denied", sa.JSON(), nullable=False),
        sa.Column("enrolled_at", UtcDateTime(), nullable=True),
        sa.Column("last_polled_at", UtcDateTime(), nullable=True),
        sa.Column("next_due_at", UtcDateTime(), nullable=True),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("last_outcome", sa.String(32), nullable=True),
        sa.Column("last_code", sa.String(64), nullable=True),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
        sa.Column("dropped_at", UtcDateTime(), nullable=True),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", UtcDateTime(), nullable=True),
        sa.CheckConstraint(f"state IN ({_STATES})", name=op.f("ck_users_state")),
        sa.CheckConstraint(
            "(token_ciphertext IS NULL) = (token_key_id IS NULL)",
            name=op.f("ck_users_token_and_key"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("user", name=op.f("uq_users_user")),
    )
    op.create_index("ix_users_due", "users", ["next_due_at", "id"])
    op.create_index("ix_users_lease_owner", "users", ["lease_owner"])

    op.create_table(
        "snapshots",
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("endpoint", sa.String(32), nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.Column("payload", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("fetched_at", UtcDateTime(), nullable=False),
        sa.Column("changed_at", UtcDateTime(), nullable=False),
        sa.CheckConstraint("status IN ('ok', 'none')", name=op.f("ck_snapshots_status")),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_snapshots_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("user_id", "endpoint", name=op.f("pk_snapshots")),
    )

    op.create_table(
        "history",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("endpoint", sa.String(32), nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.Column("payload", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("fetched_at", UtcDateTime(), nullable=False),
        sa.CheckConstraint("status IN ('ok', 'none')", name=op.f("ck_history_status")),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_history_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_history")),
    )
    op.create_index(
        "ix_history_user_id_endpoint_fetched_at", "history", ["user_id", "endpoint", "fetched_at"]
    )

    op.create_table(
        "pending_enrollments",
        sa.Column("state_hash", sa.String(64), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("verifier_ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("verifier_key_id", sa.String(64), nullable=False),
        sa.Column("redirect_uri", sa.Text(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("used_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("state_hash", name=op.f("pk_pending_enrollments")),
    )
    op.create_index("ix_pending_enrollments_expires_at", "pending_enrollments", ["expires_at"])

    op.create_table(
        "instances",
        sa.Column("instance_id", sa.String(128), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("started_at", UtcDateTime(), nullable=False),
        sa.Column("heartbeat_at", UtcDateTime(), nullable=False),
        sa.CheckConstraint("kind IN ('run', 'serve')", name=op.f("ck_instances_kind")),
        sa.PrimaryKeyConstraint("instance_id", name=op.f("pk_instances")),
    )

    op.create_table(
        "client_budget",
        sa.Column("client_id", sa.String(255), nullable=False),
        sa.Column("limit", sa.Integer(), nullable=True),
        sa.Column("remaining", sa.Integer(), nullable=True),
        sa.Column("reset_at", UtcDateTime(), nullable=True),
        sa.Column("window_seconds", sa.Float(), nullable=True),
        sa.Column("observed_at", UtcDateTime(), nullable=False),
        sa.Column("reserved", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("client_id", name=op.f("pk_client_budget")),
    )

    op.create_table(
        "passes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("instance", sa.String(128), nullable=False),
        sa.Column("started_at", UtcDateTime(), nullable=False),
        sa.Column("finished_at", UtcDateTime(), nullable=False),
        sa.Column("stopped", sa.String(32), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=False),
        sa.Column("reads", sa.Integer(), nullable=False),
        sa.Column("throttled", sa.Integer(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_passes")),
    )
    op.create_index("ix_passes_finished_at", "passes", ["finished_at"])
