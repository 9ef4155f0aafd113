"""Leases between instances: claims under concurrency, renewal, expiry after a crash, and
the users of a dead instance going to the others (on SQLite and PostgreSQL)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lta_worker.config import LONG_TERM_SCOPES
from lta_worker.domain import UserUpdate
from lta_worker.secret import Secret
from lta_worker.storage import Keyring, Store, Vault
from support.pg import PG_ENV, PG_SKIP, throwaway_database

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=3)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated database with 40 due users, on each backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'lta.db'}"
        _fill(url)
        yield url
        return
    admin = os.environ.get(PG_ENV)
    if not admin:
        pytest.skip(PG_SKIP)
    with throwaway_database(admin) as url:
        _fill(url)
        yield url


def _fill(url: str) -> None:
    vault = Vault(Keyring({"k1": os.urandom(32)}))
    with Store.open(url) as store:
        store.upgrade()
        for n in range(40):
            user = f"user-{n:02d}"
            token = vault.encrypt(Secret(f"dspa_{user}_{n}"), user=user)
            store.store_token(
                user, token, LONG_TERM_SCOPES, T0, next_due_at=T0 - timedelta(minutes=n)
            )


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


def test_renewed_leases_are_not_taken(db_url: str) -> None:
    """A live instance renews its leases; past the first expiry nobody else gets its users."""
    with Store.open(db_url) as owner, Store.open(db_url) as other:
        held = claim(owner, "owner", T0, limit=5)
        assert owner.renew_leases("owner", T0 + 2 * LEASE) == 5
        taken = claim(other, "other", T0 + LEASE + timedelta(seconds=1), limit=40)
        assert not set(held) & set(taken)


def test_an_expired_owner_cannot_write_over_the_new_owner(db_url: str) -> None:
    """A stalled instance whose lease expired and was taken over has its late write skipped."""
    with Store.open(db_url) as stalled, Store.open(db_url) as other:
        (user,) = claim(stalled, "stalled", T0, limit=1)
        assert claim(other, "other", T0 + LEASE + timedelta(seconds=1), limit=1) == [user]
        row = stalled.get_user(user)
        assert row is not None
        late = UserUpdate(
            user_id=row.id,
            state="active",
            next_due_at=T0 + timedelta(hours=1),
            consecutive_failures=0,
            last_outcome="ok",
            last_polled_at=T0,
        )
        assert stalled.apply([late], owner="stalled") == 0
        assert other.apply([late], owner="other") == 1


def test_release_frees_what_a_stopping_instance_did_not_read(db_url: str) -> None:
    """Leases released at a pass's end are claimable at once, without waiting for expiry."""
    with Store.open(db_url) as leaving, Store.open(db_url) as other:
        held = claim(leaving, "leaving", T0, limit=4)
        assert leaving.release("leaving") == 4
        assert sorted(claim(other, "other", T0, limit=4)) == sorted(held)


def test_release_all_frees_every_lease_and_says_whose(db_url: str) -> None:
    """release_all (SQLite start-up) frees all leases and counts them per owner."""
    with Store.open(db_url) as store:
        claim(store, "a", T0, limit=3)
        claim(store, "b", T0, limit=2)
        assert store.release_all() == {"a": 3, "b": 2}
        assert store.release_all() == {}
        assert len(claim(store, "c", T0, limit=40)) == 40
