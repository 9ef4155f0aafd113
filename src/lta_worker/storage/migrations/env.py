"""Alembic environment: migrate the `Database` that `storage.migrate` passes in.

The whole upgrade runs in one write transaction (BEGIN IMMEDIATE on SQLite; an advisory
lock on PostgreSQL), so concurrent starts serialize and the second finds nothing to do.
On SQLite it runs with foreign keys off, as Alembic's batch mode needs: rebuilding `users`
drops the old table, which would otherwise delete every row referring to it (ON DELETE
CASCADE: a 0.1.0 database's results); `PRAGMA foreign_key_check` then proves them intact.
"""

from __future__ import annotations

from alembic import context

from lta_worker.storage._migrate import pg_upgrade_lock
from lta_worker.storage._models import schema_metadata


def run_migrations_online() -> None:
    """Run the pending migrations inside one write transaction of the given database."""
    db = context.config.attributes["database"]
    with db.write(foreign_keys=False) as conn:
        if db.dialect == "postgresql":
            pg_upgrade_lock(conn)
        context.configure(
            connection=conn,
            target_metadata=schema_metadata(),
            render_as_batch=db.dialect == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        if db.dialect == "sqlite" and conn.exec_driver_sql("PRAGMA foreign_key_check").first():
            raise RuntimeError("the migration broke a foreign key; nothing was changed")


if context.is_offline_mode():
    raise RuntimeError("lta-worker migrations run online only (`storage.migrate.upgrade`)")
run_migrations_online()
