"""`users forget` in storage (`begin_drop(purge=True)`): none of the user's data is left, feed
and webhook receivers learn it, a reused id starts afresh. Over every backend."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import select

from lta_worker.domain import GRID, GRID_SIZE, ChangeEstimate, UserUpdate
from lta_worker.storage import OutboxEvent, Store, User, Vault
from support.storage import HOUR, MINUTE, T0, enroll, read_turn

from .test_feed import take


def read(user_id: int, minute: int, value: int) -> UserUpdate:
    """A turn that read new content and learned an estimate."""
    at = T0 + minute * MINUTE
    belief = tuple(float(k == 20) for k in range(GRID_SIZE))
    estimate = ChangeEstimate(content=f"h{value}", seen_at=at, level=GRID[20], belief=belief)
    return replace(read_turn(user_id, at, latest_change={"v": value}), estimate=estimate)


def events(store: Store, user: str) -> list[tuple[str, dict[str, Any]]]:
    """The user's queued events as (type, data), in outbox order."""
    with store.database.read() as conn:
        rows = conn.execute(
            select(OutboxEvent.type, OutboxEvent.payload)
            .where(OutboxEvent.user == user)
            .order_by(OutboxEvent.id)
        ).all()
    return [(r.type, r.payload["data"]) for r in rows]


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
