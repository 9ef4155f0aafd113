"""The webhook outbox: an event per state change and per changed content, in the change's
transaction; delivery order per user, the same id on every attempt, dead letters and purges (a
rolled-back content: test_results). Over every backend."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from lta_worker.domain import ResultEvents, SnapshotWrite, UserUpdate, canonical_json
from lta_worker.domain._events import ACTION_CODES
from lta_worker.storage import OutboxEvent, Store, Vault
from lta_worker.storage import _outbox as outbox
from lta_worker.storage._apply import write_batch
from support.storage import MINUTE, T0, enroll, read_turn

HOUR = timedelta(hours=1)


def queued(store: Store) -> list[tuple[str, str, dict[str, Any]]]:
    """Every queued event as (user, type, data), in outbox order."""
    with store.database.read() as conn:
        rows = conn.execute(
            select(OutboxEvent.user, OutboxEvent.type, OutboxEvent.payload).order_by(OutboxEvent.id)
        ).all()
    return [(r.user, r.type, r.payload["data"]) for r in rows]


def turn(user_id: int, state: str, **kw: Any) -> UserUpdate:
    """A pass's decision about one user."""
    values: dict[str, Any] = {
        "next_due_at": T0 + HOUR,
        "consecutive_failures": 0,
        "last_outcome": "ok",
        "last_polled_at": T0 + MINUTE,
        **kw,
    }
    return UserUpdate(user_id=user_id, state=state, **values)  # type: ignore[arg-type]


def test_enrollment_rotation_and_deletion_are_queued(store: Store, vault: Vault) -> None:
    """store_token queues enrolled then rotated; delete_token queues the new state;
    begin_drop queues dropping, finish_drop dropped, a stale finish nothing."""
    enroll(store, vault, "alice")
    enroll(store, vault, "alice")
    store.delete_token("alice", "dropped", T0 + HOUR)
    enroll(store, vault, "alice")  # after a drop: enrolled again, not a rotation
    start = store.begin_drop("alice", T0 + HOUR)
    assert not store.finish_drop(start.after.id, start.after.generation - 1, T0 + HOUR)
    assert store.finish_drop(start.after.id, start.after.generation, T0 + 2 * HOUR)
    assert [t for _, t, _ in queued(store)] == [
        "user.enrolled",
        "user.rotated",
        "user.dropped",
        "user.enrolled",
        "user.dropping",
        "user.dropped",
    ]
    assert queued(store)[2][2]["old_state"] == "active"


@pytest.mark.parametrize(
    ("state", "code", "event"),
    [
        ("revoked", "PermanentAccessRevoked", "user.revoked"),
        ("unlinked", "NoCloudSyncLinked", "user.unlinked"),
        ("parked", "CloudSyncInactive", "user.parked"),
        ("rejected", None, "user.rejected"),
    ],
)
def test_a_pass_decision_queues_its_change(
    store: Store, vault: Vault, state: str, code: str | None, event: str
) -> None:
    """apply queues one event per changed state, with the code as the reason."""
    row = enroll(store, vault, "u")
    store.apply([turn(row.id, state, last_outcome=state, last_code=code)])
    assert queued(store)[-1] == (
        "u",
        event,
        {
            "user": "u",
            "old_state": "active",
            "new_state": state,
            "reason": code or state,
            "endpoint": None,
            "client_action": queued(store)[-1][2]["client_action"],
            "action": ACTION_CODES[event],
        },
    )


def test_no_change_no_event_and_a_replay_adds_none(store: Store, vault: Vault) -> None:
    """An ok turn of an active user queues nothing; replaying a change queues it once; a 403
    without a code queues scope_denied for that endpoint, not again while denied."""
    row = enroll(store, vault, "u")
    store.apply([turn(row.id, "active")])
    assert len(queued(store)) == 1
    denied = {"stats": T0 + HOUR}
    store.apply([turn(row.id, "active", denied=denied)])
    store.apply([turn(row.id, "active", denied=denied)])
    assert [(t, d["endpoint"]) for _, t, d in queued(store)][1:] == [("user.scope_denied", "stats")]
    parked = turn(row.id, "parked", last_outcome="inactive")
    store.apply([parked])
    store.apply([parked])
    assert [t for _, t, _ in queued(store)] == ["user.enrolled", "user.scope_denied", "user.parked"]
    store.apply([turn(row.id, "active")])
    assert queued(store)[-1][1] == "user.active"


def test_a_discarded_decision_queues_nothing(store: Store, vault: Vault) -> None:
    """A fenced decision (user changed since the claim) queues no state or result event."""
    row = enroll(store, vault, "u")
    read = SnapshotWrite("stats", "ok", {"v": 1}, T0 + MINUTE)
    stale = turn(row.id, "revoked", generation=row.generation + 5, snapshots=(read,))
    discarded: list[tuple[UserUpdate, str]] = []
    assert store.apply([stale], discarded=discarded) == 0
    assert discarded == [(stale, "changed")]
    assert [t for _, t, _ in queued(store)] == ["user.enrolled"]


def test_claims_take_the_oldest_event_of_each_user_only(store: Store, vault: Vault) -> None:
    """Only each user's oldest event is claimed, leased until acknowledged, backed off or
    released at start (a killed delivery's: due at once, same ids)."""
    for user in ("a", "b"):
        row = enroll(store, vault, user)
        store.apply([turn(row.id, "parked", last_outcome="inactive")])
    heads = store.claim_events(T0 + HOUR, 10, T0 + HOUR + MINUTE)
    assert [(e.user, e.type, e.attempts) for e in heads] == [
        ("a", "user.enrolled", 1),
        ("b", "user.enrolled", 1),
    ]
    assert store.claim_events(T0 + HOUR, 10, T0 + 2 * HOUR) == []
    store.events_delivered([heads[0].id])
    store.event_failed(heads[1].id, T0 + 3 * HOUR, "HTTP 503")
    later = store.claim_events(T0 + 2 * HOUR, 10, T0 + 2 * HOUR + MINUTE)
    assert [(e.user, e.type) for e in later] == [("a", "user.parked")]
    retry = store.claim_events(T0 + 3 * HOUR, 10, T0 + 3 * HOUR + MINUTE)
    assert [(e.event_id, e.attempts) for e in retry if e.user == "b"] == [(heads[1].event_id, 2)]
    assert store.claim_events(T0 + 3 * HOUR, 10, T0 + 4 * HOUR) == []
    assert store.release_events(T0 + 3 * HOUR) == len(retry)  # a killed delivery's, at start
    again = store.claim_events(T0 + 3 * HOUR, 10, T0 + 4 * HOUR)
    assert [(e.event_id, e.attempts) for e in again] == [(e.event_id, 3) for e in retry]


def test_old_events_are_dead_lettered_counted_and_purged(store: Store, vault: Vault) -> None:
    """Past max_age live events become dead letters: skipped, counted, deleted after keep."""
    row = enroll(store, vault, "u")  # queued at T0
    store.apply([turn(row.id, "parked", last_outcome="inactive", last_polled_at=T0 + 2 * HOUR)])
    assert store.dead_letter_events(T0 + 3 * HOUR, max_age=2 * HOUR) == 1
    counts = store.outbox_counts()
    assert (counts.backlog, counts.dead, counts.oldest_at) == (1, 1, T0 + 2 * HOUR)
    heads = store.claim_events(T0 + 3 * HOUR, 10, T0 + 4 * HOUR)
    assert [e.type for e in heads] == ["user.parked"]
    assert store.purge_events(T0 + 3 * HOUR + MINUTE, keep_dead=HOUR) == 0
    assert store.purge_events(T0 + 5 * HOUR, keep_dead=HOUR) == 1
    assert store.purge_events(T0 + 5 * HOUR, keep_dead=HOUR, live=True) == 1
    assert store.outbox_counts().backlog == 0


def test_event_and_state_change_commit_together(store: Store, vault: Vault) -> None:
    """A batch whose transaction fails writes neither the state change nor its event."""
    row = enroll(store, vault, "u")
    upd = turn(row.id, "revoked", last_outcome="revoked")

    def crash_after_the_writes() -> None:
        with store.database.write() as conn:
            with outbox.watch_turns(conn, [upd], T0) as turns:
                write_batch(conn, store.database.dialect, [upd], None, T0)
                turns.written.append(upd)
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        crash_after_the_writes()
    again = store.get_user("u")
    assert again is not None
    assert again.state == "active"
    assert [t for _, t, _ in queued(store)] == ["user.enrolled"]


# -- result.changed: with each changed content, after the turn's state events ----------------


def changes(store: Store) -> list[dict[str, Any]]:
    """The `data` of every queued result.changed, in outbox order."""
    return [data for _, kind, data in queued(store) if kind == "result.changed"]


def sha(payload: Any) -> str:
    return hashlib.sha256(canonical_json(payload)).hexdigest()


def test_first_and_changed_contents_are_queued_with_both_hashes(store: Store, vault: Vault) -> None:
    """The first and each changed content are queued with both hashes; the same content is not."""
    row = enroll(store, vault, "alice")
    t1, t2, t3 = T0 + MINUTE, T0 + 2 * MINUTE, T0 + 3 * MINUTE
    store.apply([read_turn(row.id, t1, latest_change={"v": 1}, stats={"s": 1})])
    store.apply([read_turn(row.id, t2, latest_change={"v": 1}, stats={"s": 1})])
    store.apply([read_turn(row.id, t3, latest_change={"v": 2}, stats={"s": 1})])
    action = changes(store)[0]["client_action"]

    def event(endpoint: str, at: Any, content: Any, previous: Any) -> dict[str, Any]:
        return {
            "user": "alice",
            "endpoint": endpoint,
            "status": "ok",
            "read_at": at.isoformat(),
            "content_hash": sha(content),
            "previous_hash": previous and sha(previous),
            "client_action": action,
            "action": "read_result",
        }

    assert changes(store) == [
        event("latest-change", t1, {"v": 1}, None),
        event("stats", t1, {"s": 1}, None),
        event("latest-change", t3, {"v": 2}, {"v": 1}),
    ]


def test_a_replay_and_an_older_read_queue_nothing(store: Store, vault: Vault) -> None:
    """Replaying a turn, or a read older than the stored one, queues no second event."""
    row = enroll(store, vault, "u")
    turn = read_turn(row.id, T0 + 2 * MINUTE, latest_change={"v": 1})
    store.apply([turn])
    store.apply([turn])
    store.apply([read_turn(row.id, T0 + MINUTE, latest_change={"v": 0})])
    assert len(changes(store)) == 1


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("off", None), ("hash", False), ("content", True)],
)
def test_what_the_event_carries_follows_the_setting(
    store: Store, vault: Vault, mode: ResultEvents, expected: bool | None
) -> None:
    """off: no event; hash: the hashes only; content: the content too."""
    store.result_events = mode
    row = enroll(store, vault, "u")
    store.apply([read_turn(row.id, T0 + MINUTE, latest_change={"v": [1, 2]})])
    found = changes(store)
    if expected is None:
        assert found == []
        return
    (data,) = found
    assert ("content" in data) is expected
    if expected:
        assert data["content"] == {"v": [1, 2]}


def test_state_events_come_before_the_result_of_the_same_turn(store: Store, vault: Vault) -> None:
    """A parked user read again: user.active, then its result.changed (order per user)."""
    row = enroll(store, vault, "u")
    store.apply([read_turn(row.id, T0 + MINUTE, state="parked")])
    store.apply([read_turn(row.id, T0 + 2 * MINUTE, latest_change=None)])
    types = [t for _, t, _ in queued(store)]
    assert types == ["user.enrolled", "user.parked", "user.active", "result.changed"]


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["turn", "enroll", "revoke", "drop", "finish"]),
        st.sampled_from(["a", "b"]),
        st.sampled_from(["active", "parked", "unlinked", "rejected", "revoked"]),
        st.booleans(),
    ),
    max_size=12,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS)
def test_queued_events_chain_each_users_states(store: Store, vault: Vault, ops: Any) -> None:
    """Whatever the operations, each user's state events chain (old_state to new_state) to it."""
    run = uuid.uuid4().hex[:8]
    for step, (op, name, state, deny) in enumerate(ops):
        user, now = f"{run}-{name}", T0 + step * MINUTE
        row = store.get_user(user)
        if op == "enroll" or row is None:
            enroll(store, vault, user, due=now)
        elif op == "turn" and row.token is not None and row.state != "dropping":
            denied = {"stats": now + HOUR} if deny else {}
            store.apply([turn(row.id, state, last_outcome=state, denied=denied)], now=now)
        elif op == "revoke":
            store.delete_token(user, "revoked", now)
        elif op == "drop":
            store.begin_drop(user, now)
        elif op == "finish" and row.state == "dropping":
            store.finish_drop(row.id, row.generation, now)
    for name in ("a", "b"):
        user = f"{run}-{name}"
        chain = [d for u, t, d in queued(store) if u == user and t != "user.scope_denied"]
        row = store.get_user(user)
        if row is None:
            assert chain == []
            continue
        previous = None
        for data in chain:
            assert data["old_state"] == previous
            previous = data["new_state"]
        assert previous == row.state
