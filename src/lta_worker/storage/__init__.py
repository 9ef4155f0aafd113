"""Storage: the database (SQLite or PostgreSQL) as `Store`, its migrations, the token vault."""

from __future__ import annotations

from lta_worker.storage._db import require_sqlite_writable
from lta_worker.storage._dberrors import DATABASE_ERRORS, map_driver_error
from lta_worker.storage._migrate import HEAD_REVISION
from lta_worker.storage._models import (
    History,
    OutboxEvent,
    PendingEnrollmentRow,
    User,
    UserLease,
    schema_metadata,
)
from lta_worker.storage._rotation import rotate_keys
from lta_worker.storage._store import Store
from lta_worker.storage._vault import (
    Keyring,
    TokenDecryptError,
    Vault,
    generate_key_line,
    load_key_file,
)

__all__ = [
    "DATABASE_ERRORS",
    "HEAD_REVISION",
    "History",
    "Keyring",
    "OutboxEvent",
    "PendingEnrollmentRow",
    "Store",
    "TokenDecryptError",
    "User",
    "UserLease",
    "Vault",
    "generate_key_line",
    "load_key_file",
    "map_driver_error",
    "require_sqlite_writable",
    "rotate_keys",
    "schema_metadata",
]
