"""Pending enrollments: stored under the state's hash, taken once, atomically, until expiry."""

from __future__ import annotations

import threading
from datetime import timedelta

from sqlalchemy import text

from lta_worker.domain import PendingEnrollment
from lta_worker.secret import Secret
from lta_worker.storage import Store, Vault
from lta_worker.storage._enrollments import state_hash
from support.storage import MINUTE, T0

STATE = "st_Zq8f3kq2nD9xVwS1_ab"
VERIFIER = Secret("ver_" + "x" * 60)


def pending(vault: Vault, user: str = "alice", ttl: timedelta = 10 * MINUTE) -> PendingEnrollment:
    """A pending enrollment for `user` created at T0."""
    return PendingEnrollment(
        user=user,
        verifier=vault.encrypt(VERIFIER, user=user, purpose="verifier"),
        redirect_uri="https://app.example/lta/callback",
        created_at=T0,
        expires_at=T0 + ttl,
    )


def test_save_then_take_once_until_expiry(store: Store, vault: Vault) -> None:
    """A saved consent (state plain or Secret) is taken back whole once, until it expires."""
    saved = pending(vault)
    store.save_pending(Secret(STATE), saved)  # hashed as the plain string
    assert store.take_pending("other-state", T0) is None
    taken = store.take_pending(STATE, T0 + MINUTE)
    assert taken == saved
    assert vault.decrypt(taken.verifier, user="alice", purpose="verifier") == VERIFIER
    assert store.take_pending(STATE, T0 + MINUTE) is None
    store.save_pending(STATE + "2", pending(vault))
    assert store.take_pending(STATE + "2", T0 + 10 * MINUTE) is None


def test_only_the_hash_of_the_state_is_stored(store: Store, vault: Vault) -> None:
    """The database holds sha256(state), never the state itself."""
    store.save_pending(STATE, pending(vault))
    with store.database.read() as conn:
        row = conn.execute(text("SELECT * FROM pending_enrollments")).one()
    assert state_hash(STATE) in tuple(row)
    assert not any(STATE in str(value) for value in row)


def test_concurrent_takes_succeed_once(store_url: str, vault: Vault) -> None:
    """Eight concurrent takes of the same state: exactly one gets the consent."""
    with Store.open(store_url) as setup:
        setup.save_pending(STATE, pending(vault))
    barrier = threading.Barrier(8)
    got: list[PendingEnrollment | None] = []

    def taker() -> None:
        with Store.open(store_url) as mine:
            barrier.wait(timeout=30)
            got.append(mine.take_pending(STATE, T0))

    threads = [threading.Thread(target=taker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(got) == 8
    assert sum(p is not None for p in got) == 1


def test_a_link_is_spent_once_and_kept_until_it_expires(store: Store, vault: Vault) -> None:
    """A link's nonce is spent once and its record outlives the consents' purge until expiry;
    the purge takes used and expired consents, never a live one."""
    assert store.spend_link("nonce-1", "alice", T0, T0 + 60 * MINUTE) is True
    assert store.spend_link("nonce-1", "alice", T0 + MINUTE, T0 + 60 * MINUTE) is False
    assert store.spend_link("nonce-2", "alice", T0, T0 + 60 * MINUTE) is True
    assert store.take_latest_pending("alice", T0) is None
    assert store.take_pending("link:nonce-1", T0) is None
    store.save_pending(STATE, pending(vault))
    store.save_pending("expired", pending(vault, ttl=-MINUTE))
    store.save_pending("live", pending(vault))
    assert store.take_pending(STATE, T0) is not None
    assert store.purge_expired(T0, timedelta(days=30)).pending == 2  # used and expired
    assert store.take_pending("live", T0) is not None
    assert store.spend_link("nonce-1", "alice", T0, T0 + 60 * MINUTE) is False
    assert store.purge_expired(T0 + 61 * MINUTE, timedelta(days=30)).pending == 3
