"""Instances, pass summaries and the shared client budget."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest
from sqlalchemy import text

from lta_worker.domain import BudgetSeen, PassRecord
from lta_worker.errors import InstanceLockedError
from lta_worker.storage import Store, Vault
from lta_worker.storage import _instances as instances
from support.storage import MINUTE, T0, enroll, keyring

TTL = timedelta(seconds=90)


def test_register_heartbeat_live_unregister_prune(store: Store) -> None:
    """Instances live while their heartbeat is recent; re-registering replaces; gone once pruned."""
    store.register_instance("i1", "serve", T0)
    store.register_instance("i2", "run", T0 + MINUTE)
    assert [i.instance for i in store.live_instances(T0 + MINUTE, TTL)] == ["i1", "i2"]
    first = store.live_instances(T0, TTL)[0]
    here = (socket.gethostname(), os.getpid())
    assert (first.host, first.pid, first.kind, first.started_at) == (*here, "serve", T0)
    assert [i.instance for i in store.live_instances(T0 + 2 * MINUTE, TTL)] == ["i2"]
    assert store.heartbeat("i1", T0 + 2 * MINUTE) is True
    assert len(store.live_instances(T0 + 2 * MINUTE, TTL)) == 2
    store.unregister("i1")
    assert store.heartbeat("i1", T0 + 3 * MINUTE) is False
    assert [i.instance for i in store.live_instances(T0 + 2 * MINUTE, TTL)] == ["i2"]
    store.register_instance("i2", "serve", T0 + 3 * MINUTE)
    (row,) = store.live_instances(T0 + 3 * MINUTE, TTL)
    assert (row.kind, row.started_at) == ("serve", T0 + 3 * MINUTE)
    store.register_instance("old", "run", T0 - 10 * MINUTE)
    assert store.prune_instances(T0 + 3 * MINUTE, TTL) == 1
    assert [i.instance for i in store.live_instances(T0, timedelta(days=1))] == ["i2"]


def test_unregister_releases_leases(store: Store) -> None:
    """Unregistering an instance frees the users it had leased."""
    vault = Vault(keyring())
    enroll(store, vault, "a", due=T0 - MINUTE)
    store.register_instance("i1", "run", T0)
    lease = {"now": T0, "due_before": T0, "limit": 5, "lease_until": T0 + 5 * MINUTE}
    assert len(store.claim_due(owner="i1", **lease)) == 1  # type: ignore[arg-type]
    store.unregister("i1")
    assert len(store.claim_due(owner="i2", **lease)) == 1  # type: ignore[arg-type]


def record(n: int) -> PassRecord:
    """A pass summary finishing n minutes after T0."""
    return PassRecord(
        instance="i1",
        started_at=T0 + (n - 1) * MINUTE,
        finished_at=T0 + n * MINUTE,
        stopped="completed",
        exit_code=0,
        reads=n,
        throttled=0,
        counts={"ok": n, "transient": 1},
    )


def test_passes(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """last_pass is the latest finished (`read`: that read somebody, `answered`: whose reads
    did not all fail); only the newest PASSES_KEPT are kept."""
    assert store.last_pass() is None
    monkeypatch.setattr(instances, "PASSES_KEPT", 3)
    for n in (1, 2, 5, 4):
        store.record_pass(record(n))
    assert store.last_pass() == record(5)
    with store.database.read() as conn:
        assert conn.execute(text("SELECT count(*) FROM passes")).scalar_one() == 3
    failed = PassRecord("i1", T0, T0 + 6 * MINUTE, "completed", 0, 4, 0, {"transient": 4})
    empty = PassRecord("i1", T0, T0 + 7 * MINUTE, "completed", 0, 0, 0, {})
    store.record_pass(failed)
    store.record_pass(empty)
    assert store.last_pass() == empty
    assert store.last_pass(read=True) == failed
    assert store.last_pass(answered=True) == record(4)  # 5 was pruned


def test_read_health_from_the_users_last_reads(store: Store) -> None:
    """The latest answered read, and the users whose last read failed after it."""
    from lta_worker.domain import UserUpdate

    vault = Vault(keyring())
    assert store.read_health().last_answered_at is None
    ids = {u: enroll(store, vault, u, due=T0).id for u in ("a", "b", "c")}

    def read(user: str, outcome: str, minute: int, failures: int) -> None:
        when = T0 + minute * MINUTE
        store.apply([UserUpdate(ids[user], "active", when, failures, outcome, last_polled_at=when)])

    read("a", "ok", 1, 0)
    read("b", "transient", 0, 1)  # failed before the answered read: not counted
    read("c", "transient", 2, 2)
    health = store.read_health()
    assert (health.last_answered_at, health.failing) == (T0 + MINUTE, 1)


def seen(remaining: int, at: int = 0) -> BudgetSeen:
    """A budget observation `at` minutes after T0."""
    return BudgetSeen(
        limit=120,
        remaining=remaining,
        reset_at=T0 + timedelta(minutes=60),
        window_seconds=3600.0,
        observed_at=T0 + at * MINUTE,
    )


def test_budget_round_trip_and_stale_observations(store: Store) -> None:
    """record_budget stores the newest observation; an older one is ignored."""
    assert store.budget_seen("client") is None
    store.record_budget("client", seen(100, at=2))
    store.record_budget("client", seen(50, at=1))
    assert store.budget_seen("client") == seen(100, at=2)
    store.record_budget("client", seen(90, at=3))
    assert store.budget_seen("client") == seen(90, at=3)


def test_single_instance_lock_and_checkpoint_by_backend(store: Store, store_url: str) -> None:
    """SQLite refuses a second lock holder; PostgreSQL needs no lock (leases share work)."""
    with Store.open(store_url) as other, store.single_instance_lock():
        if store.dialect == "sqlite":
            with pytest.raises(InstanceLockedError), other.single_instance_lock():
                pass
        else:
            with other.single_instance_lock():
                pass
    assert store.checkpoint() is True
