"""Shared builders for the storage tests and the commands' tests over a database."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import func, select

from lta_worker.config import LONG_TERM_SCOPES
from lta_worker.domain import BudgetSeen, EncryptedToken, SnapshotWrite, UserRow, UserUpdate
from lta_worker.secret import Secret
from lta_worker.storage import History, Keyring, PendingEnrollmentRow, Store, Vault
from lta_worker.storage._models import FeedGone

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
R = TypeVar("R")


def keyring(*ids: str) -> Keyring:
    """A keyring with fresh random keys under `ids` (the last one current)."""
    return Keyring({key_id: os.urandom(32) for key_id in ids or ("k1",)})


def token_for(user: str) -> Secret:
    """A recognisable long term token for `user`."""
    return Secret(f"dspa_{user}_{os.urandom(12).hex()}")


def enroll(
    store: Store,
    vault: Vault,
    user: str,
    *,
    due: datetime = T0,
    scopes: tuple[str, ...] = LONG_TERM_SCOPES,
    token: Secret | None = None,
) -> UserRow:
    """Store a token for `user` (due at `due`) and return the stored row."""
    store.store_token(
        user, vault.encrypt(token or token_for(user), user=user), scopes, due, next_due_at=due
    )
    row = store.get_user(user)
    assert row is not None
    return row


class FakeStore:
    """One budget row in memory, behind a lock, as `Store.update_budget` keeps it."""

    def __init__(self, row: BudgetSeen | None = None, reserved: int = 0) -> None:
        self.row, self.reserved = row, reserved
        self.calls = 0
        self._lock = threading.Lock()

    def update_budget(
        self, client_id: str, fn: Callable[[BudgetSeen | None, int], tuple[Any, int, R]]
    ) -> R:
        with self._lock:
            self.calls += 1
            new_row, reserved, result = fn(self.row, self.reserved)
            if new_row is not None:
                self.row, self.reserved = new_row, reserved
            return result


def read_turn(user_id: int, at: datetime, state: str = "active", **payloads: Any) -> UserUpdate:
    """A turn at `at` that read `payloads` (endpoint with `_` for `-` -> payload; None: a
    404), due again an hour later."""
    return UserUpdate(
        user_id=user_id,
        state=state,  # type: ignore[arg-type]
        next_due_at=at + HOUR,
        consecutive_failures=0,
        last_outcome="ok",
        last_polled_at=at,
        snapshots=tuple(
            SnapshotWrite(
                endpoint=name.replace("_", "-"),  # type: ignore[arg-type]
                status="none" if payload is None else "ok",
                payload=payload,
                fetched_at=at,
            )
            for name, payload in payloads.items()
        ),
    )


def position(cursor: str | int) -> int:
    """Where a feed cursor stands in its history (`0`: the start)."""
    return int(str(cursor).rpartition(".")[2])


def newest_position(store: Store) -> int:
    """The feed position of the newest row or gone line stored (0: none)."""
    with store.database.read() as conn:
        return max(
            conn.execute(select(func.max(table.seq))).scalar() or 0 for table in (History, FeedGone)
        )


def stored_verifiers(store: Store, vault: Vault) -> list[str]:
    """Every PKCE verifier the store holds (used consents stay until the purge), decrypted."""
    table = PendingEnrollmentRow.__table__
    with store.database.read() as conn:
        rows = conn.execute(
            select(table.c.user, table.c.verifier_ciphertext, table.c.verifier_key_id).where(
                table.c.verifier_key_id != ""
            )
        ).all()
    return [
        vault.decrypt(
            EncryptedToken(bytes(r.verifier_ciphertext), r.verifier_key_id),
            user=r.user,
            purpose="verifier",
        ).reveal()
        for r in rows
    ]
