"""Fencing (a pass's update is written only under the generation it claimed; every lifecycle
change bumps it) and the two-phase drop in storage (issue 11), on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from lta_worker.domain import GRID, GRID_SIZE, ChangeEstimate, SnapshotWrite, UserRow, UserUpdate
from lta_worker.domain._drop import DROP_START
from lta_worker.storage import Store, Vault, _outbox
from support.storage import MINUTE, T0, enroll, keyring, read_turn, token_for

HOUR = timedelta(hours=1)


@pytest.fixture
def vault() -> Vault:
    """A one-key vault."""
    return Vault(keyring("k1"))


def claim_one(store: Store, owner: str = "i1", now: datetime = T0) -> UserRow:
    (row,) = store.claim_due(
        now=now, due_before=now, limit=1, owner=owner, lease_until=now + 5 * MINUTE
    )
    return row


def turn(row: UserRow, payload: object = None, **changes: Any) -> UserUpdate:
    """What a pass decides for `row`: ok, with a stats snapshot, fenced by its generation."""
    decided = read_turn(row.id, T0, stats=payload or {"v": 1})
    return replace(decided, **{"generation": row.generation, **changes})


def test_a_claim_bumps_the_generation(store: Store, vault: Vault) -> None:
    """Each claim bumps the generation: an older claim's or an unleased decision is not written."""
    enrolled = enroll(store, vault, "a")
    first = claim_one(store)
    store.release("i1")
    assert store.apply([turn(first)], owner="i1") == 0
    second = claim_one(store)
    assert enrolled.generation < first.generation < second.generation
    assert store.apply([turn(first)], owner="i1") == 0
    assert store.apply([turn(second)], owner="i1") == 1


@pytest.mark.parametrize("change", ["re-enroll", "drop", "forget", "revoke"])
def test_a_change_outside_the_pass_discards_its_decision(
    store: Store, vault: Vault, change: str
) -> None:
    """Re-enrollment, drop (purged or not) or revocation after the claim: nothing is written."""
    enroll(store, vault, "a")
    claimed = claim_one(store)
    if change == "re-enroll":
        store.store_token("a", vault.encrypt(token_for("a"), user="a"), ["s"], T0, T0)
    elif change in ("drop", "forget"):
        store.begin_drop("a", T0, purge=change == "forget")
    else:
        store.delete_token("a", "revoked", T0)
    before = store.get_user("a")
    discarded: list[tuple[UserUpdate, str]] = []
    update = turn(claimed, state="revoked", delete_token=True)
    assert store.apply([update], owner="i1", discarded=discarded) == 0
    assert discarded == [(update, "changed")]
    assert store.get_user("a") == before
    assert list(store.export_results("a")) == []
    assert store.history("a", "stats") == []


@pytest.mark.parametrize("why", ["failed", "changed"])
def test_one_bad_decision_leaves_its_batch_mates_written(
    store: Store, vault: Vault, why: str
) -> None:
    """A user whose write fails, or who re-enrolled since the claim, is skipped alone."""
    for name in ("a", "b", "c"):
        enroll(store, vault, name, due=T0 - MINUTE)
    rows = store.claim_due(now=T0, due_before=T0, limit=3, owner="i1", lease_until=T0 + HOUR)
    by_name = {r.user: r for r in rows}
    if why == "failed":
        bad = turn(by_name["b"], payload={"not json": {1, 2}})  # a set cannot be stored as JSON
    else:
        store.store_token("b", vault.encrypt(token_for("b"), user="b"), ["s"], T0, T0)
        bad = turn(by_name["b"])
    batch = [turn(by_name["a"]), bad, turn(by_name["c"], state="revoked", delete_token=True)]
    discarded: list[tuple[UserUpdate, str]] = []
    assert store.apply(batch, owner="i1", discarded=discarded) == 2
    assert discarded == [(bad, why)]
    assert {r.user for r in store.export_results()} == {"a", "c"}
    b, c = store.get_user("b"), store.get_user("c")
    assert c is not None and (c.state, c.token) == ("revoked", None)
    assert b is not None and b.last_polled_at is None  # untouched
    assert why == "changed" or b.next_due_at == T0 - MINUTE  # still due


def test_a_dropping_user_is_never_claimed_for_a_read(store: Store, vault: Vault) -> None:
    """`dropping` keeps the token only for the DELETE: no claim, not counted due."""
    enroll(store, vault, "a", due=T0 - MINUTE)
    store.begin_drop("a", T0 - MINUTE)
    assert store.count_due(T0 + HOUR) == 0
    assert store.claim_due(now=T0, due_before=T0 + HOUR, limit=5, owner="i1", lease_until=T0) == []
    drops = store.claim_drops(now=T0, limit=5, owner="i1", lease_until=T0 + MINUTE)
    assert [r.user for r in drops] == ["a"]


def test_begin_drop_leaves_a_tokenless_user_as_it_is(store: Store, vault: Vault) -> None:
    """Dropping a revoked user changes nothing: no relabel, revoked_at and generation kept."""
    enroll(store, vault, "a")
    store.delete_token("a", "revoked", T0)
    before = store.get_user("a")
    start = store.begin_drop("a", T0 + HOUR)
    assert start.before == start.after == before == store.get_user("a")
    with store.database.read() as conn:
        stamps = conn.execute(text("SELECT revoked_at, dropped_at FROM users")).one()
    assert stamps[1] is None


def test_finish_drop_is_fenced_too(store: Store, vault: Vault) -> None:
    """A confirmation for an older drop (the user re-enrolled since) keeps the new token."""
    enroll(store, vault, "a")
    start = store.begin_drop("a", T0)
    assert start.after.state == "dropping"
    store.store_token("a", vault.encrypt(token_for("a"), user="a"), ["s"], T0, T0)
    assert not store.finish_drop(start.after.id, start.after.generation, T0)
    assert not store.defer_drop(start.after.id, start.after.generation, retry_at=T0, reason="x")
    row = store.get_user("a")
    assert row is not None and (row.state, row.token is not None) == ("active", True)


@pytest.mark.parametrize("state", sorted(DROP_START))
def test_begin_drop_follows_the_drop_table(store: Store, vault: Vault, state: str) -> None:
    """begin_drop does what the policy's DROP_START row says for the user's state."""
    row = enroll(store, vault, "a")
    if state in ("revoked", "dropped"):
        store.delete_token("a", state, T0)  # type: ignore[arg-type]
    elif state == "dropping":
        store.begin_drop("a", T0)
    else:
        store.apply([turn(row, state=state, snapshots=(), generation=None)])
    before = store.get_user("a")
    assert before is not None and before.state == state
    start = store.begin_drop("a", T0 + HOUR)
    if DROP_START[before.state] == "unchanged":
        assert start.after == before
    else:
        assert (start.after.state, start.after.next_due_at) == ("dropping", T0 + HOUR)
        assert start.after.token == before.token
        assert start.after.generation > before.generation


def test_follow_schedule_rewrites_due_times_by_class(store: Store, vault: Vault) -> None:
    """New intervals move interval, parked and floor-adaptive users; backoffs only earlier."""
    rows = {name: enroll(store, vault, name) for name in ("i", "p", "b", "n", "a", "h")}
    plans = {
        "i": ("active", T0 + HOUR, "interval"),
        "p": ("parked", T0 + 24 * HOUR, "parked"),
        "b": ("active", T0 + 50 * MINUTE, "backoff"),
        "n": ("active", T0 + 3 * HOUR, None),
        "a": ("active", T0 + HOUR, "adaptive"),  # the plan's scale was 0: at the floor
        "h": ("active", T0 + 5 * HOUR, "adaptive"),  # set by its estimate and the budget
    }
    for name, (state, due, due_class) in plans.items():
        changes = {"state": state, "next_due_at": due, "due_class": due_class}
        store.apply([turn(rows[name], snapshots=(), generation=None, **changes)])
    assert store.follow_schedule(HOUR, 24 * HOUR, T0) is not None  # first: records (same)
    assert store.follow_schedule(HOUR, 24 * HOUR, T0) is None  # unchanged: nothing to do
    moved = store.follow_schedule(30 * MINUTE, 2 * HOUR, T0)
    assert moved == {"interval": 1, "parked": 1, "backoff": 1, "backoff_parked": 0, "adaptive": 1}
    due = {name: store.get_user(name).next_due_at for name in plans}  # type: ignore[union-attr]
    assert due == {
        "i": T0 + 30 * MINUTE,
        "p": T0 + 2 * HOUR,
        "b": T0 + 30 * MINUTE,
        "n": T0 + 3 * HOUR,  # not derived from a setting: untouched
        "a": T0 + 30 * MINUTE,
        "h": T0 + 5 * HOUR,
    }
    store.follow_schedule(2 * HOUR, 48 * HOUR, T0)
    due = {name: store.get_user(name).next_due_at for name in plans}  # type: ignore[union-attr]
    assert due["i"] == due["a"] == T0 + 2 * HOUR  # later, from its own read: no burst
    assert due["b"] == T0 + 30 * MINUTE  # a backoff is never moved later
    assert due["h"] == T0 + 5 * HOUR
    store.follow_schedule(6 * HOUR, 48 * HOUR, T0)
    assert store.get_user("h").next_due_at == T0 + 6 * HOUR  # type: ignore[union-attr]


def test_a_forced_follow_moves_adaptive_users_at_this_instance_s_old_floor(
    store: Store, vault: Vault
) -> None:
    """A reload another instance applied first still moves users at this instance's old floor."""
    row = enroll(store, vault, "a")
    store.follow_schedule(30 * MINUTE, 24 * HOUR, T0)  # the other instance's
    late = turn(row, next_due_at=T0 + HOUR, due_class="adaptive", snapshots=(), generation=None)
    store.apply([late])
    assert store.follow_schedule(30 * MINUTE, 24 * HOUR, T0, force=True) is not None
    assert store.get_user("a").next_due_at == T0 + HOUR  # type: ignore[union-attr]
    store.follow_schedule(30 * MINUTE, 24 * HOUR, T0, force=True, floor=HOUR)
    assert store.get_user("a").next_due_at == T0 + 30 * MINUTE  # type: ignore[union-attr]


def test_two_instances_starting_together_both_record_the_schedule(store_url: str) -> None:
    """Concurrent first calls (several instances starting) never fail on the single row."""
    with Store.open(store_url) as one, Store.open(store_url) as two:
        results: list[object] = []

        def start(store: Store) -> None:
            results.append(store.follow_schedule(HOUR, 24 * HOUR, T0))

        threads = [threading.Thread(target=start, args=(s,)) for s in (one, two, one, two)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(results) == 4
        assert one.follow_schedule(HOUR, 24 * HOUR, T0) is None


def test_two_turns_of_one_user_in_a_batch_are_written_in_order(store: Store, vault: Vault) -> None:
    """A batch holding the same user twice writes both, in order: history keeps both contents."""
    row = enroll(store, vault, "a")
    first = turn(row, {"v": 1}, generation=None)
    later = replace(first, snapshots=(SnapshotWrite("stats", "ok", {"v": 2}, T0 + HOUR),))
    assert store.apply([first, later]) == 2
    assert [h.payload for h in store.history("a", "stats")] == [{"v": 1}, {"v": 2}]
    (result,) = store.export_results("a")
    assert (result.payload, result.fetched_at) == ({"v": 2}, T0 + HOUR)
    assert result.changed_at == T0 + HOUR


def test_a_claimed_user_is_the_stored_user(store: Store, vault: Vault) -> None:
    """claim_due's records equal get_user's, field by field, a denial and an estimate too."""
    row = enroll(store, vault, "a", due=T0 - MINUTE)
    denied = {"stats": T0 + 2 * HOUR}
    belief = tuple(float(k == 20) for k in range(GRID_SIZE))
    estimate = ChangeEstimate(content="h1", seen_at=T0, level=GRID[20], belief=belief)
    changes = {"denied": denied, "last_code": "x", "estimate": estimate, "generation": None}
    store.apply([turn(row, next_due_at=T0 - MINUTE, **changes)])
    claimed = claim_one(store)
    assert claimed == store.get_user("a")
    assert (claimed.denied, claimed.last_polled_at, claimed.last_code) == (denied, T0, "x")
    assert claimed.estimate == estimate


def test_a_drop_command_holds_its_user_until_its_write(store: Store, vault: Vault) -> None:
    """A command's drop lease keeps others off while its DELETE is out, until its write."""
    enroll(store, vault, "a")
    start = store.begin_drop("a", T0, lease_until=T0 + 5 * MINUTE)
    assert start.owner is not None and not start.in_flight
    assert store.claim_drops(now=T0, limit=5, owner="i1", lease_until=T0 + MINUTE) == []
    assert store.release_all() == {}, "SQLite's start-up release leaves a command's lease"
    again = store.begin_drop("a", T0 + MINUTE, lease_until=T0 + 6 * MINUTE)
    assert again.in_flight and again.after == again.before == store.get_user("a")
    assert store.defer_drop(start.after.id, start.after.generation, retry_at=T0, reason="x")
    (retried,) = store.claim_drops(now=T0, limit=5, owner="i1", lease_until=T0 + MINUTE)
    assert retried.generation > start.after.generation


def test_a_drop_commands_lease_that_expired_is_taken_over(store: Store, vault: Vault) -> None:
    """A dead command's drop is retried once its lease expires; its late write is fenced off."""
    enroll(store, vault, "a")
    start = store.begin_drop("a", T0, lease_until=T0 + MINUTE)
    later = T0 + 2 * MINUTE
    (retried,) = store.claim_drops(now=later, limit=5, owner="i1", lease_until=later + MINUTE)
    assert not store.finish_drop(start.after.id, start.after.generation, later)
    assert store.finish_drop(retried.id, retried.generation, later)


def _wait_for_a_lock_waiter(store_url: str, started: threading.Event) -> None:
    """Return once another transaction waits for a row lock (SQLite: shortly after `started`)."""
    assert started.wait(10)
    if not store_url.startswith("postgresql"):
        time.sleep(0.3)
        return
    with psycopg.connect(store_url, autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            waiting = conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
            if waiting and waiting[0]:
                return
            time.sleep(0.01)
    raise AssertionError("the pass's write never waited for the drop's lock")


def test_a_write_that_waited_for_a_drops_lock_is_fenced_by_the_drops_lease(
    store_url: str, vault: Vault, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass's write that waited while `users drop` held the user is discarded (issue 28)."""
    with Store.open(store_url) as fleet, Store.open(store_url) as command:
        enroll(fleet, vault, "a")
        claimed = claim_one(fleet)
        in_drop, write_started = threading.Event(), threading.Event()
        record = _outbox.record

        def record_then_hold(*args: Any, **kwargs: Any) -> Any:
            # The last step of begin_drop's transaction: hold it open while the pass writes.
            out = record(*args, **kwargs)
            if threading.current_thread().name == "drop":
                in_drop.set()
                _wait_for_a_lock_waiter(store_url, write_started)
            return out

        monkeypatch.setattr(_outbox, "record", record_then_hold)
        drop = threading.Thread(
            target=command.begin_drop,
            args=("a", T0),
            kwargs={"lease_until": T0 + HOUR},
            name="drop",
        )
        drop.start()
        assert in_drop.wait(10)
        discarded: list[tuple[UserUpdate, str]] = []
        update = turn(claimed)
        applied: list[int] = []

        def write() -> None:
            write_started.set()
            applied.append(fleet.apply([update], owner="i1", discarded=discarded))

        writer = threading.Thread(target=write)
        writer.start()
        drop.join(20)
        writer.join(20)
        assert applied == [0]
        assert discarded == [(update, "changed")]
        after = fleet.get_user("a")
        assert after is not None and after.state == "dropping" and after.token is not None
        assert list(fleet.export_results("a")) == []
