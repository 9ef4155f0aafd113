"""Users: enrollment writes, keyset listing, counts, leased claims, apply and token deletion."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from lta_worker.domain import USER_STATES, UserUpdate
from lta_worker.errors import StorageError, UnknownUserError
from lta_worker.secret import Secret
from lta_worker.storage import Store, Vault
from support.storage import MINUTE, T0, enroll, keyring, read_turn

HOUR = timedelta(hours=1)


@pytest.fixture
def vault() -> Vault:
    """A one-key vault."""
    return Vault(keyring("k1"))


def test_store_token_inserts_an_active_user(store: Store, vault: Vault) -> None:
    """A first token creates the user: active, scopes kept, due as asked, token decrypts."""
    token = Secret("dspa_alice")
    rotated = store.store_token(
        "alice", vault.encrypt(token, user="alice"), ["s1", "s2", "s1"], T0, T0 + HOUR
    )
    assert rotated is False
    row = store.get_user("alice")
    assert row is not None
    assert (row.state, row.scopes) == ("active", ("s1", "s2"))
    assert (row.enrolled_at, row.next_due_at) == (T0, T0 + HOUR)
    assert row.token is not None
    assert vault.decrypt(row.token, user="alice") == token
    assert (row.consecutive_failures, dict(row.denied), row.last_outcome) == (0, {}, None)


def test_store_token_again_rotates_and_resets(store: Store, vault: Vault) -> None:
    """A second enrollment replaces the token, resets failures and denials, says it rotated."""
    row = enroll(store, vault, "alice")
    failed = {"consecutive_failures": 3, "last_outcome": "rejected", "denied": {"stats": T0}}
    store.apply([_update(row.id, state="rejected", **failed)])
    new = Secret("dspa_new")
    assert store.store_token("alice", vault.encrypt(new, user="alice"), ["s1"], T0, T0) is True
    again = store.get_user("alice")
    assert again is not None and again.token is not None
    assert vault.decrypt(again.token, user="alice") == new
    assert (again.state, again.consecutive_failures, dict(again.denied)) == ("active", 0, {})
    assert again.id == row.id


def test_store_token_after_drop_is_not_a_rotation(store: Store, vault: Vault) -> None:
    """Re-enrolling a dropped user stores a token and reports no rotation."""
    enroll(store, vault, "alice")
    store.delete_token("alice", "dropped", T0)
    assert store.store_token("alice", vault.encrypt(Secret("x"), user="alice"), [], T0, T0) is False
    row = store.get_user("alice")
    assert row is not None and row.state == "active" and row.token is not None


def test_list_users_in_keyset_batches(store: Store, vault: Vault) -> None:
    """list_users yields every user once, in id order, across batch boundaries."""
    names = [f"user-{i:02d}" for i in range(7)]
    for name in names:
        enroll(store, vault, name)
    assert [u.user for u in store.list_users(batch=3)] == names
    assert list(Store.list_users(store, batch=100)) == list(store.list_users(batch=1))


def test_counts_by_state_and_due(store: Store, vault: Vault) -> None:
    """count_by_state has every state (0 when empty); count_due counts due users with a token."""
    assert store.count_by_state() == dict.fromkeys(USER_STATES, 0)
    enroll(store, vault, "early", due=T0 - MINUTE)
    enroll(store, vault, "now", due=T0)
    enroll(store, vault, "later", due=T0 + MINUTE)
    enroll(store, vault, "gone", due=T0 - MINUTE)
    store.delete_token("gone", "revoked", T0)
    assert store.count_by_state() == {**dict.fromkeys(USER_STATES, 0), "active": 3, "revoked": 1}
    assert store.count_due(T0) == 2


def claim(store: Store, owner: str = "i1", limit: int = 10, at: datetime = T0) -> list[str]:
    """Claim users due at `at` (lease 5 minutes) and return their ids."""
    rows = store.claim_due(
        now=at, due_before=at, limit=limit, owner=owner, lease_until=at + 5 * MINUTE
    )
    return [r.user for r in rows]


def test_claim_due_order_limit_and_lease(store: Store, vault: Vault) -> None:
    """Claims take the oldest due first (then id), up to the limit, leased, never tokenless."""
    enroll(store, vault, "b", due=T0 - 2 * MINUTE)
    enroll(store, vault, "a", due=T0 - 3 * MINUTE)
    enroll(store, vault, "c", due=T0 - 2 * MINUTE)
    enroll(store, vault, "future", due=T0 + MINUTE)
    enroll(store, vault, "revoked", due=T0 - 4 * MINUTE)
    store.delete_token("revoked", "revoked", T0)
    assert claim(store, limit=0) == []
    assert claim(store, limit=2) == ["a", "b"]
    assert claim(store, owner="i2") == ["c"]
    assert claim(store, owner="i3") == []


def test_a_new_user_is_claimed_before_settled_users_not_yet_overdue(
    store: Store, vault: Vault
) -> None:
    """A user enrolled now is claimed after the overdue users, before those due later."""
    enroll(store, vault, "overdue", due=T0 - 3 * HOUR)
    for n in range(3):
        enroll(store, vault, f"settled{n}", due=T0 + MINUTE)
    store.store_token("new", vault.encrypt(Secret("x"), user="new"), [], T0, next_due_at=T0)
    rows = store.claim_due(
        now=T0, due_before=T0 + HOUR, limit=3, owner="i1", lease_until=T0 + 5 * MINUTE
    )
    assert [r.user for r in rows] == ["overdue", "new", "settled0"]


def test_renew_and_release(store: Store, vault: Vault) -> None:
    """renew_leases extends an owner's leases; release drops them (all or some)."""
    for name in ("a", "b", "c"):
        enroll(store, vault, name, due=T0 - MINUTE)
    assert len(claim(store, owner="i1")) == 3
    assert store.renew_leases("i1", T0 + HOUR) == 3
    assert store.renew_leases("other", T0 + HOUR) == 0
    assert claim(store, owner="i2", at=T0 + 30 * MINUTE) == []
    a = store.get_user("a")
    assert a is not None
    assert store.release("i1", [a.id]) == 1
    assert store.release("i1", []) == 0
    assert claim(store, owner="i2") == ["a"]
    assert store.release("i1") == 2
    assert sorted(claim(store, owner="i3")) == ["b", "c"]


def _update(user_id: int, **changes: Any) -> UserUpdate:
    return replace(read_turn(user_id, T0), **changes)


def test_apply_writes_columns_and_releases_lease(store: Store, vault: Vault) -> None:
    """apply writes the user's columns and drops the owner's lease."""
    row = enroll(store, vault, "a", due=T0 - MINUTE)
    claim(store, owner="i1")
    denied = {"stats": T0 + 2 * HOUR}
    update = _update(row.id, state="parked", last_code="CloudSyncInactive", denied=denied)
    assert store.apply([update], owner="i1") == 1
    after = store.get_user("a")
    assert after is not None
    assert (after.state, after.last_outcome) == ("parked", "ok")
    assert after.last_code == "CloudSyncInactive"
    assert (after.next_due_at, after.last_polled_at, dict(after.denied)) == (T0 + HOUR, T0, denied)
    assert after.token == row.token
    assert claim(store, owner="i2") == []  # not due any more, and not leased
    with store.database.read() as conn:
        assert conn.execute(text("SELECT count(*) FROM user_leases")).scalar_one() == 0


@pytest.mark.parametrize(("state", "asked"), [("revoked", True), ("dropped", False)])
def test_apply_of_a_tokenless_state_deletes_the_token_in_the_same_transaction(
    store: Store, vault: Vault, state: str, asked: bool
) -> None:
    """Revoked or dropped (asked to or not): ciphertext and key id go, the stamp is set once."""
    row = enroll(store, vault, "a")
    update = _update(row.id, state=state, next_due_at=None, delete_token=asked)
    assert store.apply([update], now=T0) == 1
    assert store.apply([update], now=T0 + HOUR) == 1
    after = store.get_user("a")
    assert after is not None and after.token is None and after.state == state
    with store.database.read() as conn:
        got = conn.execute(
            text("SELECT token_ciphertext, token_key_id, revoked_at, dropped_at FROM users")
        ).one()
    assert got[0] is None and got[1] is None
    stamp, other = (got[2], got[3]) if state == "revoked" else (got[3], got[2])
    assert str(stamp).startswith("2025-06-01 12:00:00") and other is None


def test_delete_token(store: Store, vault: Vault) -> None:
    """delete_token sets a tokenless state and removes the token; True only the first time."""
    enroll(store, vault, "a")
    with pytest.raises(ValueError, match="revoked"):
        store.delete_token("a", "active", T0)
    assert store.delete_token("a", "dropped", T0) is True
    assert store.delete_token("a", "dropped", T0 + HOUR) is False
    row = store.get_user("a")
    assert row is not None
    assert (row.state, row.token, row.next_due_at) == ("dropped", None, None)


def test_an_unknown_user(store: Store) -> None:
    """get_user gives None, apply skips its update, delete_token raises (exit 2)."""
    assert store.get_user("nobody") is None
    assert store.apply([_update(12345)]) == 0
    with pytest.raises(UnknownUserError) as info:
        store.delete_token("nobody", "dropped", T0)
    assert info.value.exit_code == 2


def test_token_and_key_id_go_together(store: Store, vault: Vault) -> None:
    """The schema refuses a ciphertext without a key id."""
    enroll(store, vault, "a")
    with pytest.raises(StorageError, match=r"(?i)constraint|check"), store.database.write() as conn:
        conn.execute(text("UPDATE users SET token_key_id = NULL"))


def test_one_store_shared_by_threads(store: Store, vault: Vault) -> None:
    """One Store used from several threads at once (as anyio.to_thread does) just works."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def worker(n: int) -> None:
        try:
            barrier.wait(timeout=30)
            for i in range(20):
                row = enroll(store, vault, f"t{n}-{i % 4}")
                store.apply([_update(row.id, last_outcome=f"ok{i}")])
                store.count_due(T0)
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert store.count_by_state()["active"] == 24
