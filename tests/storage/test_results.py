"""Snapshots and history: opaque payloads kept as strict JSON, history on change only, idempotent
replay, exports, purges (`results export` itself: tests/cli/test_results_feed_cmd.py); `users
forget` (`begin_drop(purge=True)`): none of the user's data is left, feed and webhook receivers
learn it, a reused id starts afresh. Over every backend."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, text

from lta_worker.domain import GRID, GRID_SIZE, ChangeEstimate, UserUpdate, canonical_json
from lta_worker.storage import Store, User, Vault
from lta_worker.storage import _results as results
from support.storage import HOUR, MINUTE, T0, enroll, read_turn

from .test_feed import take
from .test_outbox import queued

DAY = timedelta(days=1)
PAYLOAD = {"zeta": 1, "alpha": [1, 2.5, "é", None, True], "big": 2**62, "nested": {"b": 1, "a": 2}}


def dump(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the user, snapshot and history tables, for before/after comparisons."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with store.database.read() as conn:
        for table in ("users", "snapshots", "history"):
            rows = conn.execute(text(f"SELECT * FROM {table} ORDER BY 1, 2")).all()  # noqa: S608
            out[table] = [tuple(r) for r in rows]
    return out


def test_first_read_creates_snapshot_and_history_kept_exactly(store: Store, vault: Vault) -> None:
    """The first result is the snapshot and first history row, payload kept exactly."""
    row = enroll(store, vault, "a")
    store.apply([read_turn(row.id, T0, latest_change=PAYLOAD, stats=None)])
    exported = {r.endpoint: r for r in store.export_results()}
    result = exported["latest-change"]
    assert result.payload == PAYLOAD
    assert list(result.payload) == list(PAYLOAD)  # key order, unicode, big ints and floats
    assert list(result.payload["nested"]) == ["b", "a"]
    assert isinstance(result.payload["big"], int)
    assert result.fetched_at == result.changed_at == T0
    assert (exported["stats"].status, exported["stats"].payload) == ("none", None)
    assert [h.payload for h in store.history("a", "latest-change")] == [PAYLOAD]
    assert store.history("a", "stats")[0].status == "none"


def test_same_content_updates_fetched_at_only(store: Store, vault: Vault) -> None:
    """Reading the same content again moves fetched_at, keeps changed_at, adds no history."""
    row = enroll(store, vault, "a")
    store.apply([read_turn(row.id, T0, stats=PAYLOAD)])
    store.apply([read_turn(row.id, T0 + HOUR, stats=dict(reversed(PAYLOAD.items())))])
    (result,) = store.export_results()
    assert (result.fetched_at, result.changed_at) == (T0 + HOUR, T0)
    assert len(store.history("a", "stats")) == 1


def test_changed_content_appends_history(store: Store, vault: Vault) -> None:
    """A new content updates the snapshot and appends one history row; so does ok -> none."""
    row = enroll(store, vault, "a")
    store.apply([read_turn(row.id, T0, latest_change={"v": 1})])
    store.apply([read_turn(row.id, T0 + HOUR, latest_change={"v": 2})])
    store.apply([read_turn(row.id, T0 + 2 * HOUR, latest_change=None)])
    past = store.history("a", "latest-change")
    assert [(h.status, h.payload, h.fetched_at) for h in past] == [
        ("ok", {"v": 1}, T0),
        ("ok", {"v": 2}, T0 + HOUR),
        ("none", None, T0 + 2 * HOUR),
    ]
    (result,) = store.export_results()
    assert (result.status, result.changed_at) == ("none", T0 + 2 * HOUR)
    assert past[0].content_hash == results.content_hash({"v": 1})


def test_replaying_updates_writes_nothing_new(store: Store, vault: Vault) -> None:
    """Applying the same batch again (after a crash) leaves every table exactly as it was."""
    a = enroll(store, vault, "a")
    b = enroll(store, vault, "b")
    batch = [
        read_turn(a.id, T0, latest_change=PAYLOAD, stats={"n": 1}),
        read_turn(b.id, T0, latest_change=None),
    ]
    store.apply(batch)
    before = dump(store)
    store.apply(batch)
    store.apply(batch[:1])
    assert dump(store) == before


def test_older_write_is_ignored(store: Store, vault: Vault) -> None:
    """A result older than the stored one (a late replay) does not overwrite or add history."""
    row = enroll(store, vault, "a")
    store.apply([read_turn(row.id, T0 + HOUR, stats={"v": "new"})])
    store.apply([read_turn(row.id, T0, stats={"v": "old"})])
    (result,) = store.export_results()
    assert result.payload == {"v": "new"}
    assert len(store.history("a", "stats")) == 1


def test_content_hash_is_of_canonical_json_and_stable() -> None:
    """The content hash is sha256 of canonical JSON (keys sorted), equal to what earlier
    versions stored."""
    assert results.canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    assert results.content_hash(None) != results.content_hash({})
    payload = {"b": 1, "a": {"é": [1.5, None, "x"]}}
    stored = "9ddb11156cab4fdce2973998052f7fb23fdd5958af16b7b39ee8902dd911ae60"
    assert results.content_hash(payload) == stored
    assert results.content_hash(payload, canonical_json(payload)) == stored


def test_export_in_batches_and_per_user(store: Store, vault: Vault) -> None:
    """Export walks every (user, endpoint) once across batches, or one user's results."""
    for name in ("a", "b", "c"):
        row = enroll(store, vault, name)
        store.apply([read_turn(row.id, T0, latest_change={"u": name}, stats=None)])
    everything = list(store.export_results(batch=2))
    assert [(r.user, r.endpoint) for r in everything] == [
        (u, e) for u in ("a", "b", "c") for e in ("latest-change", "stats")
    ]
    assert [r.payload for r in store.export_results("b") if r.status == "ok"] == [{"u": "b"}]
    assert list(store.export_results("nobody")) == []


def test_forget_purges_one_users_results(store: Store, vault: Vault) -> None:
    """A drop with `purge` deletes that user's snapshots and history only, and counts the rows."""
    a = enroll(store, vault, "a")
    b = enroll(store, vault, "b")
    store.apply([read_turn(a.id, T0, stats={"v": 1})])
    store.apply([read_turn(a.id, T0 + HOUR, stats={"v": 2})])
    store.apply([read_turn(b.id, T0, stats={"v": 1})])
    assert store.begin_drop("a", T0, purge=True).purged == 3
    assert store.begin_drop("a", T0, purge=True).purged == 0
    assert [r.user for r in store.export_results()] == ["b"]


def test_retention_purges_revoked_and_dropped_after_delay(store: Store, vault: Vault) -> None:
    """Results of users revoked/dropped longer ago than the delay go; others stay."""
    for name in ("revoked-old", "revoked-new", "dropped-old", "active"):
        row = enroll(store, vault, name)
        store.apply([read_turn(row.id, T0 - 90 * DAY, stats={"u": name})])
    store.delete_token("revoked-old", "revoked", T0 - 31 * DAY)
    store.delete_token("revoked-new", "revoked", T0 - 29 * DAY)
    store.delete_token("dropped-old", "dropped", T0 - 30 * DAY)
    counts = store.purge_expired(T0, timedelta(days=30))
    assert (counts.users, counts.snapshots, counts.history) == (2, 2, 2)
    assert sorted(r.user for r in store.export_results()) == ["active", "revoked-new"]
    assert store.get_user("revoked-old") is not None  # the user row itself stays
    assert store.purge_expired(T0, timedelta(days=30)).users == 0
    assert store.purge_expired(T0, timedelta(0)).users == 1  # 0: revoked-new's go at once
    assert [r.user for r in store.export_results()] == ["active"]


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_the_store_refuses_a_payload_that_is_not_strict_json(
    store: Store, vault: Vault, value: float
) -> None:
    """A non-finite number fails that user's write (discarded); its batch-mate is written."""
    bad, good = enroll(store, vault, "a"), enroll(store, vault, "b")
    discarded: list[tuple[UserUpdate, str]] = []
    applied = store.apply(
        [
            read_turn(bad.id, T0, latest_change={"n": value}),
            read_turn(good.id, T0, latest_change={"n": 1}),
        ],
        discarded=discarded,
    )
    assert applied == 1
    assert [(update.user_id, why) for update, why in discarded] == [(bad.id, "failed")]
    assert [(r.user, r.payload) for r in store.export_results()] == [("b", {"n": 1})]
    # the failed write's result.changed rolled back too
    assert [user for user, kind, _ in queued(store) if kind == "result.changed"] == ["b"]


def three_contents(store: Store, vault: Vault, user: str) -> int:
    """Store three distinct latest-change contents for `user`, a day apart from T0."""
    row = enroll(store, vault, user)
    for day in range(3):
        store.apply([read_turn(row.id, T0 + day * DAY, latest_change={"n": day})])
    return row.id


def test_export_lines_carry_the_users_state(store: Store, vault: Vault) -> None:
    """Each exported result names its user's state now: revoked and dropped are recognisable."""
    for user in ("kept", "gone", "left"):
        three_contents(store, vault, user)
    store.delete_token("gone", "revoked", T0 + 3 * DAY)
    store.delete_token("left", "dropped", T0 + 3 * DAY)
    assert {r.user: r.state for r in store.export_results()} == {
        "kept": "active",
        "gone": "revoked",
        "left": "dropped",
    }


def test_history_export_in_order_per_user_and_since(store: Store, vault: Vault) -> None:
    """The history export lists every stored content in order; `since` and `user` filter it."""
    three_contents(store, vault, "a")
    three_contents(store, vault, "b")
    everything = list(store.export_history())
    assert [(r.user, r.payload) for r in everything if r.user == "a"] == [
        ("a", {"n": 0}),
        ("a", {"n": 1}),
        ("a", {"n": 2}),
    ]
    assert len(everything) == 6
    recent = list(store.export_history("b", since=T0 + DAY))
    assert [(r.payload, r.fetched_at, r.state) for r in recent] == [
        ({"n": 1}, T0 + DAY, "active"),
        ({"n": 2}, T0 + 2 * DAY, "active"),
    ]


def test_retention_history_prunes_old_contents_keeping_the_newest(
    store: Store, vault: Vault
) -> None:
    """retention.history prunes old contents but the newest per (user, endpoint), snapshot kept."""
    three_contents(store, vault, "a")
    counts = store.purge_expired(T0 + 30 * DAY, after=30 * DAY, history=10 * DAY)
    assert counts.history_pruned == 2
    assert [r.payload for r in store.export_history("a")] == [{"n": 2}]
    assert [r.payload for r in store.export_results("a")] == [{"n": 2}]
    assert store.purge_expired(T0 + 30 * DAY, after=30 * DAY, history=10 * DAY).history_pruned == 0


def read(user_id: int, minute: int, value: int) -> UserUpdate:
    """A turn that read new content and learned an estimate."""
    at = T0 + minute * MINUTE
    belief = tuple(float(k == 20) for k in range(GRID_SIZE))
    estimate = ChangeEstimate(content=f"h{value}", seen_at=at, level=GRID[20], belief=belief)
    return replace(read_turn(user_id, at, latest_change={"v": value}), estimate=estimate)


def events(store: Store, user: str) -> list[tuple[str, dict[str, Any]]]:
    """The user's queued events as (type, data), in outbox order."""
    return [(kind, data) for who, kind, data in queued(store) if who == user]


@pytest.mark.parametrize("case", ["waiting", "in_delivery", "revoked"])
def test_forget_leaves_no_waiting_content(store: Store, vault: Vault, case: str) -> None:
    """A forget removes waiting content and queues `user.forgotten` (then `user.dropping`)."""
    store.result_events = "content"
    row = enroll(store, vault, "alice")
    store.apply([read(row.id, 1, 1)])
    if case == "in_delivery":
        assert store.claim_events(T0 + HOUR, 10, T0 + 2 * HOUR)
    if case == "revoked":
        store.delete_token("alice", "revoked", T0 + HOUR)
    state = store.get_user("alice")
    assert state is not None
    store.begin_drop("alice", T0 + 2 * HOUR, purge=True)
    queued = events(store, "alice")
    assert "content" not in str(queued) and "'v': 1" not in str(queued)
    (kind, forgotten), *rest = queued
    assert (kind, forgotten["reason"], forgotten["old_state"]) == (
        "user.forgotten",
        "forget",
        state.state,
    )
    expected = [] if case == "revoked" else [("user.dropping", "forget")]
    assert [(k, d["reason"]) for k, d in rest] == expected


def test_forget_erases_what_was_learned_and_a_reused_id_inherits_nothing(
    store: Store, vault: Vault
) -> None:
    """A forget erases what was learned; the id enrolled again inherits nothing, feed included."""
    row = enroll(store, vault, "alice")
    store.apply([read(row.id, 1, 1)])
    assert store.get_user("alice").estimate is not None  # type: ignore[union-attr]
    start = store.begin_drop("alice", T0 + HOUR, purge=True)
    assert store.finish_drop(start.after.id, start.after.generation, T0 + HOUR)
    with store.database.read() as conn:
        kept = conn.execute(
            select(User.estimate, User.plan_bucket, User.rate_bucket, User.last_polled_at)
        ).one()
    assert tuple(kept) == (None, None, None, None)
    assert events(store, "alice")[-1][1]["reason"] == "forget"  # user.dropped
    again = enroll(store, vault, "alice", due=T0 + 2 * HOUR)
    assert (again.estimate, again.last_polled_at, again.state) == (None, None, "active")
    assert list(store.export_results("alice")) == []
    # `take` waits out another session's open transaction (parallel PostgreSQL tests).
    assert take(store, 0)[1] == [("alice", "forget")]


def test_a_forgotten_user_refuses_links_issued_before(store: Store, vault: Vault) -> None:
    """`forgotten_since` refuses links issued before a forget (or undated), none issued after it."""
    enroll(store, vault, "alice")
    assert not store.forgotten_since("alice", None)
    store.begin_drop("alice", T0 + HOUR, purge=True)
    assert store.forgotten_since("alice", T0 + HOUR - MINUTE)
    assert store.forgotten_since("alice", None)
    assert not store.forgotten_since("alice", T0 + HOUR + MINUTE)
