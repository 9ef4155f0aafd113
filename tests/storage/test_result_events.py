"""`result.changed` in the outbox: queued with each changed content, after the turn's state
events; never for the same content or a replay (fenced: test_outbox; rolled back:
test_strict_json). Over every backend."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from sqlalchemy import select

from lta_worker.domain import ResultEvents, canonical_json
from lta_worker.storage import OutboxEvent, Store, Vault
from support.storage import MINUTE, T0, enroll, keyring
from support.storage import read_turn as read


@pytest.fixture
def vault() -> Vault:
    """A one-key vault."""
    return Vault(keyring("k1"))


def changes(store: Store) -> list[dict[str, Any]]:
    """The `data` of every queued result.changed, in outbox order."""
    with store.database.read() as conn:
        rows = conn.execute(
            select(OutboxEvent.payload)
            .where(OutboxEvent.type == "result.changed")
            .order_by(OutboxEvent.id)
        ).scalars()
        return [r["data"] for r in rows]


def sha(payload: Any) -> str:
    return hashlib.sha256(canonical_json(payload)).hexdigest()


def test_first_and_changed_contents_are_queued_with_both_hashes(store: Store, vault: Vault) -> None:
    """The first and each changed content are queued with both hashes; the same content is not."""
    row = enroll(store, vault, "alice")
    t1, t2, t3 = T0 + MINUTE, T0 + 2 * MINUTE, T0 + 3 * MINUTE
    store.apply([read(row.id, t1, latest_change={"v": 1}, stats={"s": 1})])
    store.apply([read(row.id, t2, latest_change={"v": 1}, stats={"s": 1})])
    store.apply([read(row.id, t3, latest_change={"v": 2}, stats={"s": 1})])
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
    turn = read(row.id, T0 + 2 * MINUTE, latest_change={"v": 1})
    store.apply([turn])
    store.apply([turn])
    store.apply([read(row.id, T0 + MINUTE, latest_change={"v": 0})])
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
    store.apply([read(row.id, T0 + MINUTE, latest_change={"v": [1, 2]})])
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
    store.apply([read(row.id, T0 + MINUTE, state="parked")])
    store.apply([read(row.id, T0 + 2 * MINUTE, latest_change=None)])
    with store.database.read() as conn:
        types = conn.execute(select(OutboxEvent.type).order_by(OutboxEvent.id)).scalars().all()
    assert types == ["user.enrolled", "user.parked", "user.active", "result.changed"]
