"""Driver errors as `ConfigError` (exit 78) or, when not recognised, `StorageError` (75).

A failed PostgreSQL connection has no SQLSTATE: libpq's English messages are matched.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from lta_worker.errors import ConfigError, LtaError, StorageError

_SETTING: Final = "database.url"
# SQLSTATE classes and codes that a configuration change fixes.
_CONFIG_SQLSTATE_CLASSES: Final = ("28",)  # invalid authorization specification
_CONFIG_SQLSTATES: Final = frozenset(
    {
        "3D000",  # invalid_catalog_name: no such database
        "42501",  # insufficient_privilege: the role lacks a grant
        "3F000",  # invalid_schema_name
    }
)
_CONFIG_MESSAGES: Final = re.compile(
    r"database \".*\" does not exist"
    r"|role \".*\" does not exist"
    r"|password authentication failed"
    r"|no password supplied"
    r"|(peer|ident|ldap|radius|certificate|gss|sspi|scram) authentication failed"
    r"|no pg_hba\.conf entry"
    r"|permission denied for database"
    r"|invalid [\w ]{0,40}value"
    r"|invalid connection option"
    r"|server does not support SSL"
    r"|certificate (verify failed|.* does not exist)"
    r"|root certificate file"
    r"|(unable to open database file|attempt to write a readonly database|readonly database)",
    re.IGNORECASE,
)
_CONFIG_HINT: Final = (
    "check database.url (host, database name, role, sslmode) and the database's permissions; "
    "keep a password in ~/.pgpass, not in the URL"
)
SQLITE_WRITABLE_HINT: Final = (
    "make the SQLite file and its directory writable by the user running lta-worker, "
    "or set database.url"
)
# SQLite's primary result codes (the low byte of an extended code).
_SQLITE_CORRUPT: Final = 11
_SQLITE_NOTADB: Final = 26
_NOTADB_HINT: Final = (
    "restore it from a backup or point database.url at the right file; nothing was changed"
)
_CORRUPT_HINT: Final = (
    "stop lta-worker and restore the file from a backup "
    "(`sqlite3 FILE 'PRAGMA integrity_check'` shows the damage)"
)
_TEMPORARY_HINT: Final = "check that the database is reachable; the pass can be rerun"
_DISK = re.compile(r"disk is full|disk I/O error|no space left|could not extend", re.IGNORECASE)
_DISK_HINT: Final = (
    "free disk space where the database lives (and check the disk); nothing committed is "
    "lost, the pass can be rerun"
)


def describe(exc: DBAPIError, password: str | None = None) -> str:
    """A one-line description of a driver error, without SQL, parameters or password."""
    orig = exc.orig
    text = " ".join(str(orig).split()) if orig is not None else ""
    kind = type(orig).__name__ if orig is not None else type(exc).__name__
    if password:
        text = text.replace(password, "[redacted]")
    return f"{kind}: {text}" if text else kind


def is_configuration(exc: DBAPIError) -> bool:
    """True when fixing the configuration (URL, role, database, permissions) is the cure."""
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        return sqlstate in _CONFIG_SQLSTATES or sqlstate.startswith(_CONFIG_SQLSTATE_CLASSES)
    return bool(_CONFIG_MESSAGES.search(str(orig) if orig is not None else str(exc)))


def _damaged_sqlite(exc: DBAPIError, path: Path | None) -> ConfigError | None:
    """A ConfigError for a SQLite file that is not a database or is corrupt, else None."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    if not isinstance(code, int) or code & 0xFF not in (_SQLITE_NOTADB, _SQLITE_CORRUPT):
        return None
    name = repr(str(path)) if path is not None else "the SQLite database"
    if code & 0xFF == _SQLITE_NOTADB:
        message = f"{name} is not a SQLite database (or is encrypted or corrupt)"
        return ConfigError(message, key=_SETTING, hint=_NOTADB_HINT)
    message = f"{name} is corrupt ({describe(exc)})"
    return ConfigError(message, key=_SETTING, hint=_CORRUPT_HINT)


DATABASE_ERRORS: Final = (DBAPIError, PoolTimeout)


def map_driver_error(
    exc: DBAPIError | PoolTimeout, password: str | None = None, path: Path | None = None
) -> LtaError:
    """The lta-worker error for a driver error (or pool timeout): ConfigError or StorageError."""
    if not isinstance(exc, DBAPIError):
        return StorageError(
            "no database connection came free in time: the database answers slowly or not "
            "at all, and every pooled connection waits for it",
            hint=_TEMPORARY_HINT,
        )
    damaged = _damaged_sqlite(exc, path)
    if damaged is not None:
        return damaged
    what = describe(exc, password)
    if is_configuration(exc):
        sqlite = exc.orig is not None and type(exc.orig).__module__.startswith("sqlite3")
        return ConfigError(
            f"the database cannot be used as configured ({what})",
            key=_SETTING,
            hint=SQLITE_WRITABLE_HINT if sqlite else _CONFIG_HINT,
        )
    hint = _DISK_HINT if _DISK.search(what) else _TEMPORARY_HINT
    return StorageError(f"the database refused the operation ({what})", hint=hint)
