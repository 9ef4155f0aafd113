"""Storage: the database (SQLite or PostgreSQL), its migrations, and the token vault.

`Store` (`_store`, one query group per module) takes and returns the domain's records;
`Vault` and the key file (`_vault`); the tables (`_models`) for the migrations,
the benchmarks' bulk loads and tests; driver errors as exit 78 or 75 (`_dberrors`).
"""

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
