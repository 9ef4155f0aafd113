"""Key rotation: every token and live verifier moves to the newest key, resumably, safely."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from lta_worker.domain import EncryptedToken, PendingEnrollment
from lta_worker.errors import UnknownKeyError
from lta_worker.secret import Secret
from lta_worker.storage import Keyring, Store, Vault, rotate_keys
from lta_worker.storage._rotation import StoredSecret
from support.storage import MINUTE, T0, enroll, keyring, token_for

USERS = [f"user-{i}" for i in range(7)]


@pytest.fixture
def rings() -> tuple[Keyring, Keyring, Keyring]:
    """(old only, old+new, new only) keyrings sharing key material."""
    both = keyring("k-old", "k-new")
    old = Keyring({"k-old": both.keys["k-old"]})
    new = Keyring({"k-new": both.keys["k-new"]})
    return old, both, new


def plant(store: Store, vault: Vault) -> dict[str, Secret]:
    """Enroll USERS and two pending consents under `vault`; return the plaintexts by name."""
    tokens = {user: token_for(user) for user in USERS}
    for user, token in tokens.items():
        enroll(store, vault, user, token=token)
    for n in range(2):
        verifier = Secret(f"verifier-{n}-" + "v" * 40)
        tokens[f"state-{n}"] = verifier
        store.save_pending(
            f"state-{n}",
            PendingEnrollment(
                user=f"pending-{n}",
                verifier=vault.encrypt(verifier, user=f"pending-{n}", purpose="verifier"),
                redirect_uri="https://app.example/cb",
                created_at=T0,
                expires_at=T0 + 10 * MINUTE,
            ),
        )
    return tokens


def assert_all_decrypt(store: Store, vault: Vault, tokens: dict[str, Secret]) -> None:
    """Every planted token and verifier decrypts under `vault` to its plaintext."""
    for user in USERS:
        row = store.get_user(user)
        assert row is not None and row.token is not None
        assert row.token.key_id == vault.current_key_id
        assert vault.decrypt(row.token, user=user) == tokens[user]
    for n in range(2):
        taken = store.take_pending(f"state-{n}", T0)
        assert taken is not None
        verifier = vault.decrypt(taken.verifier, user=taken.user, purpose="verifier")
        assert verifier == tokens[f"state-{n}"]


def test_rotate_then_remove_old_key(store: Store, rings: tuple[Keyring, ...]) -> None:
    """After rotation the old key line can go: everything decrypts; a second run is a no-op."""
    old, both, new = rings
    tokens = plant(store, Vault(old))
    report = rotate_keys(store, Vault(both), T0, batch=3)
    assert report.key_id == "k-new"
    assert (report.rotated, report.already_current, report.failed) == (9, 0, 0)
    assert store.key_ids_in_use(T0) == {"k-new": 9}
    again = rotate_keys(store, Vault(both), T0)
    assert (again.rotated, again.already_current, again.failed) == (0, 9, 0)
    assert_all_decrypt(store, Vault(new), tokens)


def test_unknown_key_refuses_before_changing_anything(
    store: Store, rings: tuple[Keyring, ...]
) -> None:
    """A stored key id missing from the key file raises UnknownKeyError; nothing is modified."""
    old, _, new = rings
    plant(store, Vault(old))
    enroll(store, Vault(new), "fresh")
    with store.database.read() as conn:
        before = conn.execute(text("SELECT id, token_ciphertext FROM users ORDER BY id")).all()
    with pytest.raises(UnknownKeyError, match="'k-old'") as info:
        rotate_keys(store, Vault(new), T0)
    assert info.value.exit_code == 78
    with store.database.read() as conn:
        after = conn.execute(text("SELECT id, token_ciphertext FROM users ORDER BY id")).all()
    assert before == after


class Interrupting:
    """A Store stand-in that fails after `swaps` successful batches (a killed rotation)."""

    def __init__(self, store: Store, swaps: int) -> None:
        self._store = store
        self._left = swaps

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def reencrypt(self, swaps: Sequence[tuple[StoredSecret, EncryptedToken]]) -> int:
        if self._left == 0:
            raise KeyboardInterrupt
        self._left -= 1
        return self._store.reencrypt(swaps)


def test_interrupted_rotation_resumes(store: Store, rings: tuple[Keyring, ...]) -> None:
    """A rotation killed midway leaves a mix that still decrypts; running it again finishes."""
    old, both, new = rings
    tokens = plant(store, Vault(old))
    with pytest.raises(KeyboardInterrupt):
        rotate_keys(Interrupting(store, 2), Vault(both), T0, batch=2)  # type: ignore[arg-type]
    assert store.key_ids_in_use(T0) == {"k-new": 4, "k-old": 5}
    resumed = rotate_keys(store, Vault(both), T0, batch=2)
    assert (resumed.rotated, resumed.already_current) == (5, 4)
    assert_all_decrypt(store, Vault(new), tokens)


def test_swap_loses_to_a_concurrent_reenrollment(store: Store, rings: tuple[Keyring, ...]) -> None:
    """A token re-enrolled between read and swap is not overwritten by the rotation."""
    old, both, _ = rings
    enroll(store, Vault(old), "alice")
    items = store.secrets_for_rotation("token", exclude_key_id="k-new", now=T0)
    swaps = [(i, Vault(both).reencrypt(i.secret, user=i.user)) for i in items]
    fresh = Secret("dspa_fresh")
    store.store_token("alice", Vault(both).encrypt(fresh, user="alice"), [], T0, T0)
    assert store.reencrypt(swaps) == 0
    row = store.get_user("alice")
    assert row is not None and row.token is not None
    assert Vault(both).decrypt(row.token, user="alice") == fresh


def test_tampered_row_is_counted_and_left_alone(store: Store, rings: tuple[Keyring, ...]) -> None:
    """A row that no longer authenticates is reported as failed and left as it was."""
    old, both, _ = rings
    plant(store, Vault(old))
    bad = store.get_user(USERS[0])
    assert bad is not None and bad.token is not None
    flipped = bytearray(bad.token.ciphertext)
    flipped[-1] ^= 1
    store.store_token(
        USERS[0], dataclasses.replace(bad.token, ciphertext=bytes(flipped)), [], T0, T0
    )
    report = rotate_keys(store, Vault(both), T0)
    assert (report.rotated, report.failed) == (8, 1)
    after = store.get_user(USERS[0])
    assert after is not None and after.token is not None
    assert after.token.ciphertext == bytes(flipped)


def test_dead_pending_rows_are_not_rotated(store: Store, rings: tuple[Keyring, ...]) -> None:
    """Used or expired consents are neither checked nor rotated."""
    old, both, _ = rings
    plant(store, Vault(old))
    later = T0 + timedelta(hours=1)
    report = rotate_keys(store, Vault(both), later)
    assert report.rotated == 7
    assert store.key_ids_in_use(later) == {"k-new": 7}
