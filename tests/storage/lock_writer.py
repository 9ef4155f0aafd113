"""Child of the SQLite concurrency test: `lock_writer.py URL NAME COUNT` waits for stdin to close,
runs COUNT read-then-write transactions, and prints {"errors": n, "seconds": s} as JSON,
n counting "database is locked"/busy failures."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta

from lta_worker.domain import BudgetSeen, SnapshotWrite, UserUpdate
from lta_worker.errors import StorageError
from lta_worker.secret import Secret
from lta_worker.storage import Keyring, Store, Vault

T0 = datetime(2025, 6, 1, tzinfo=UTC)


def _take_one(seen: BudgetSeen | None, reserved: int) -> tuple[BudgetSeen | None, int, int | None]:
    """Take one permit from the shared budget row (None: no row yet)."""
    if seen is None:
        return None, reserved, None
    return seen, reserved + 1, 1


def one_write(store: Store, vault: Vault, name: str, i: int) -> None:
    """One write transaction, chosen by `i`; most read a row before they write."""
    user = f"{name}-{i % 25}"
    now = T0 + timedelta(seconds=i)
    kind = i % 5
    if kind == 0 or store.get_user(user) is None:
        token = vault.encrypt(Secret(f"dspa_{user}_{i}"), user=user)
        store.store_token(user, token, ["s"], now, now)
    elif kind == 1:
        row = store.get_user(user)
        assert row is not None
        snap = SnapshotWrite("stats", "ok", {"i": i, "user": user}, now)
        store.apply(
            [UserUpdate(row.id, "active", now + timedelta(hours=1), 0, "ok", snapshots=(snap,))],
            owner=name,
        )
    elif kind == 2:
        if store.update_budget("client", _take_one) is None:
            store.record_budget("client", BudgetSeen(120, 100, None, 3600.0, now))
    elif kind == 3:
        store.delete_token(user, "dropped", now)
    else:
        store.claim_due(
            now=now, due_before=now, limit=5, owner=name, lease_until=now + timedelta(minutes=5)
        )
        store.release(name)


def main() -> None:
    """Run the writes and report."""
    url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    vault = Vault(Keyring({"k1": bytes(range(32))}))
    errors = 0
    with Store.open(url) as store:
        store.check_schema()
        sys.stdin.read()
        started = time.perf_counter()
        for i in range(count):
            try:
                one_write(store, vault, name, i)
            except StorageError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                errors += 1
        seconds = time.perf_counter() - started
    print(json.dumps({"errors": errors, "seconds": round(seconds, 3)}))


if __name__ == "__main__":
    main()
