"""The database as the read-only commands see it, and how long an instance counts as live."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lta_worker.config import Settings
    from lta_worker.storage import Store


def instance_ttl(settings: Settings) -> timedelta:
    """How long an instance stays live without a heartbeat: four heartbeats."""
    return 4 * settings.serve.heartbeat


def open_store_readonly(settings: Settings) -> Store:
    """Open the configured database read-only, its schema checked and never migrated.

    For the commands that only read (`status`, `users list`, `results export`, `check`):
    they never create the SQLite file and never migrate a shared database during a rolling
    upgrade.

    Raises:
        SchemaOutdatedError: no database, no schema or an older one (exit 78: `db upgrade`).
        SchemaTooNewError: the database was migrated by a newer lta-worker (exit 78).
        StorageError: the database cannot be reached (exit 75).
    """
    from lta_worker.storage import Store

    store = Store.open(settings.database.url, read_only=True)
    try:
        store.check_schema()
    except BaseException:
        store.close()
        raise
    return store
