"""Storage: the database (SQLite or PostgreSQL) and the token vault.

Public face:

- `Store` — every query the engine, the CLI and enrollment need (`storage.store`).
- `Vault`, `Keyring`, `TokenDecryptError` — AES-256-GCM encryption of tokens at rest and
  the key file (`storage.vault`, `storage.keyfile`).
- `rotate_keys` — `keys rotate` (`storage.rotation`).
- `HEAD_REVISION` — the schema revision this code knows (`storage.migrate`).
- the plain records that cross the boundary (`storage.records`).

The records are imported eagerly (they are cheap); everything that pulls in SQLAlchemy or
cryptography is imported on first use, so importing `lta_worker.storage.records` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lta_worker.storage.records import (
    ENDPOINTS,
    USER_STATES,
    BudgetReservation,
    BudgetSeen,
    EncryptedToken,
    Endpoint,
    HistoryRow,
    InstanceRow,
    PassRecord,
    PendingEnrollment,
    PurgeCounts,
    ResultRow,
    RotationReport,
    SnapshotWrite,
    UserRow,
    UserState,
    UserUpdate,
)

if TYPE_CHECKING:
    from lta_worker.storage.keyfile import Keyring, generate_key_line, load_key_file
    from lta_worker.storage.migrate import HEAD_REVISION
    from lta_worker.storage.rotation import rotate_keys
    from lta_worker.storage.store import Store
    from lta_worker.storage.vault import TokenDecryptError, Vault

_LAZY = {
    "Store": "lta_worker.storage.store",
    "Vault": "lta_worker.storage.vault",
    "TokenDecryptError": "lta_worker.storage.vault",
    "Keyring": "lta_worker.storage.keyfile",
    "load_key_file": "lta_worker.storage.keyfile",
    "generate_key_line": "lta_worker.storage.keyfile",
    "rotate_keys": "lta_worker.storage.rotation",
    "HEAD_REVISION": "lta_worker.storage.migrate",
}

__all__ = [
    "ENDPOINTS",
    "HEAD_REVISION",
    "USER_STATES",
    "BudgetReservation",
    "BudgetSeen",
    "EncryptedToken",
    "Endpoint",
    "HistoryRow",
    "InstanceRow",
    "Keyring",
    "PassRecord",
    "PendingEnrollment",
    "PurgeCounts",
    "ResultRow",
    "RotationReport",
    "SnapshotWrite",
    "Store",
    "TokenDecryptError",
    "UserRow",
    "UserState",
    "UserUpdate",
    "Vault",
    "generate_key_line",
    "load_key_file",
    "rotate_keys",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lta_worker.storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
