"""`user_leases` loses its foreign key to `users`: nothing it guarded can happen.

A lease row is only ever written for a user row the same transaction holds: a claim for the
rows it locked (`FOR UPDATE` on PostgreSQL, the write lock on SQLite), `begin_drop` for the
row it just updated; and no `users` row is ever deleted (a dropped or forgotten user stays,
state `dropped`), so the key's check never failed and its cascade never ran. The check was
not free: on PostgreSQL each lease a claim inserts ran it (a trigger reading the user's row
again), a thousand per claim of 1,000 users, a third of the claim's time on the server
(bench B3PG). SQLite's claim already skipped it (`Database.write(checked=False)`).

On SQLite the table is rebuilt (`batch_alter_table`: SQLite cannot drop a constraint); it
holds only the live leases.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_KEY = "fk_user_leases_user_id_users"


def upgrade() -> None:
    """Drop `user_leases.user_id`'s foreign key."""
    with op.batch_alter_table("user_leases") as batch:
        batch.drop_constraint(_KEY, type_="foreignkey")
