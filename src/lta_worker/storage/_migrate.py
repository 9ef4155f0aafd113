"""Schema version checks (without importing Alembic) and programmatic Alembic migrations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from sqlalchemy import Connection, inspect, text

from lta_worker.errors import SchemaTooNewError, StorageError

if TYPE_CHECKING:
    from alembic.config import Config

    from lta_worker.storage._db import Database

REVISIONS: Final[tuple[str, ...]] = ("0001", "0002", "0003")  # a test checks them
HEAD_REVISION: Final[str] = REVISIONS[-1]
SCRIPT_LOCATION: Final = "lta_worker.storage:migrations"
VERSION_TABLE: Final = "alembic_version"
_PG_LOCK_KEY: Final = 0x17A_0001  # pg_advisory_xact_lock key serializing concurrent upgrades

SchemaStatus = Literal["current", "empty", "behind"]


def current_revision(conn: Connection) -> str | None:
    """The revision stamped in the database, or None when it has no schema yet."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(rows) > 1:
        raise StorageError(
            f"the database has several schema heads ({', '.join(sorted(rows))})",
            hint="this database was migrated by a branch lta-worker does not know",
        )
    return rows[0] if rows else None


def classify(revision: str | None) -> SchemaStatus:
    """Compare a stamped revision with this code's; raise SchemaTooNewError when unknown."""
    if revision is None:
        return "empty"
    if revision == HEAD_REVISION:
        return "current"
    if revision in REVISIONS:
        return "behind"
    raise SchemaTooNewError(
        f"the database schema is at revision {revision!r}, newer than this lta-worker knows "
        f"(latest known: {HEAD_REVISION!r})",
        hint="upgrade lta-worker on this host; no data was changed",
    )


def alembic_config(db: Database | None = None) -> Config:
    """An Alembic config pointing at the packaged migrations (no alembic.ini needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.set_main_option("path_separator", "os")
    if db is not None:
        config.attributes["database"] = db
    return config


def upgrade(db: Database) -> bool:
    """Migrate to `HEAD_REVISION`; True when one ran. Safe from several processes at once."""
    with db.read() as conn:
        if classify(current_revision(conn)) == "current":
            return False
    from alembic import command

    command.upgrade(alembic_config(db), "head")
    return True


def pg_upgrade_lock(conn: Connection) -> None:
    """Serialize concurrent upgrades on PostgreSQL, without statement and lock timeouts."""
    conn.execute(text("SET LOCAL statement_timeout = 0"))
    conn.execute(text("SET LOCAL lock_timeout = 0"))
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
