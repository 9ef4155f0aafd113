"""Shared builders for the storage tests and the commands' tests over a database."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from lta_worker.config import LONG_TERM_SCOPES
from lta_worker.domain import UserRow
from lta_worker.secret import Secret
from lta_worker.storage import Keyring, Store, Vault

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


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
