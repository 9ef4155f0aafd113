"""Leases between instances: claims under concurrency, renewal, expiry after a crash, and
the users of a dead instance going to the others (on SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest

from lta_worker.storage import Store, Vault
from support.storage import T0, enroll, keyring, read_turn

LEASE = timedelta(seconds=3)


@pytest.fixture
def db_url(store_url: str) -> str:
    """A migrated database with 40 due users, on each backend."""
    vault = Vault(keyring("k1"))
    with Store.open(store_url) as store:
        for n in range(40):
            enroll(store, vault, f"user-{n:02d}", due=T0 - timedelta(minutes=n))
    return store_url


def claim(store: Store, owner: str, now: datetime, limit: int = 10) -> list[str]:
    rows = store.claim_due(
        now=now, due_before=now, limit=limit, owner=owner, lease_until=now + LEASE
    )
    return [r.user for r in rows]


def test_claimers_on_their_own_connections_split_the_users(db_url: str) -> None:
    """Six instances claiming at once, each on its own connection: every user once, no overlap."""
    barrier = threading.Barrier(6)
    claimed: dict[str, list[str]] = {}

    def instance(name: str) -> None:
        with Store.open(db_url) as store:
            barrier.wait(timeout=30)
            mine: list[str] = []
            while batch := claim(store, name, T0, limit=3):
                mine += batch
            claimed[name] = mine

    threads = [threading.Thread(target=instance, args=(f"i{n}",)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    everyone = [user for users in claimed.values() for user in users]
    assert sorted(everyone) == [f"user-{n:02d}" for n in range(40)]


def test_a_dead_instances_users_go_to_the_others_once_its_leases_expire(db_url: str) -> None:
    """A crashed instance's users go to another once its leases expire, naming whose."""
    with Store.open(db_url) as dead, Store.open(db_url) as alive:
        heard: list[tuple[str, int]] = []
        alive.on_lease_expired = lambda owner, users: heard.append((owner, users))
        held = claim(dead, "dead", T0, limit=5)  # ...and then it crashes: no release
        assert len(held) == 5
        before_expiry = claim(alive, "alive", T0 + LEASE - timedelta(milliseconds=1), limit=40)
        assert not set(held) & set(before_expiry)
        assert heard == []
        after_expiry = claim(alive, "alive", T0 + LEASE + timedelta(milliseconds=1), limit=40)
        assert sorted(after_expiry) == sorted(held)
        assert heard == [("dead", 5)]


def test_an_expired_owner_cannot_write_over_the_new_owner(db_url: str) -> None:
    """A stalled instance whose lease expired and was taken over has its late write skipped."""
    with Store.open(db_url) as stalled, Store.open(db_url) as other:
        (user,) = claim(stalled, "stalled", T0, limit=1)
        assert claim(other, "other", T0 + LEASE + timedelta(seconds=1), limit=1) == [user]
        row = stalled.get_user(user)
        assert row is not None
        late = read_turn(row.id, T0)
        assert stalled.apply([late], owner="stalled") == 0
        assert other.apply([late], owner="other") == 1


def test_release_all_frees_every_lease_and_says_whose(db_url: str) -> None:
    """release_all (SQLite start-up) frees all leases and counts them per owner."""
    with Store.open(db_url) as store:
        claim(store, "a", T0, limit=3)
        claim(store, "b", T0, limit=2)
        assert store.release_all() == {"a": 3, "b": 2}
        assert store.release_all() == {}
        assert len(claim(store, "c", T0, limit=40)) == 40
