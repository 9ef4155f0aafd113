"""Storage: the database (SQLite or PostgreSQL), its migrations, and the token vault.

- `Store`: every query the engine, the CLI and enrollment need, over SQLAlchemy 2 Core
  (`_store`: the query groups of `_users`, `_leases`, `_drops`, `_results`, `_feed`,
  `_outbox`, `_schedule`, `_freshness`, `_instances`, `_enrollments`, `_rotation` over one
  database; a batch of turns written in a few statements in `_apply`, rows turned into
  records in `_rows`);
- `Vault`, `Keyring`, `TokenDecryptError`, `load_key_file`, `generate_key_line`:
  AES-256-GCM encryption of tokens at rest and the key file (`_vault`, `_keyfile`);
- `rotate_keys`: `keys rotate` (`_rotation`); `HEAD_REVISION`: the schema revision this
  code knows (`_migrate`); `map_driver_error`: a driver error (or a pool with no connection
  free, both `DATABASE_ERRORS`) as a configuration (78) or temporary (75) error
  (`_dberrors`); `require_sqlite_writable`: what `check` asks of a SQLite file and its
  directory, without writing (`_db`);
- the tables (`User`, `UserLease`, `History`, `PendingEnrollmentRow`, `OutboxEvent`) and
  `schema_metadata`, for the migrations, the benchmarks' bulk loads and the tests that look
  at rows (`_models`).

The records it takes and returns are the domain's (`lta_worker.domain`).
"""

from __future__ import annotations

from lta_worker.storage._db import require_sqlite_writable
from lta_worker.storage._dberrors import DATABASE_ERRORS, map_driver_error
from lta_worker.storage._keyfile import Keyring, generate_key_line, load_key_file
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
from lta_worker.storage._vault import TokenDecryptError, Vault

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
