"""The change feed (`Store.changed_since`): every content stored after a cursor, once, in the
order stored, and a cursor to pass next time that no later write falls behind. Over every
backend (two instances and out-of-order commits on PostgreSQL: tests/multi/test_feed.py)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from lta_worker.domain import SnapshotWrite, UserUpdate
from lta_worker.storage import History, Store, Vault
from support.storage import MINUTE, T0, enroll, keyring

HOUR = timedelta(hours=1)


@pytest.fixture
def vault() -> Vault:
    """A one-key vault."""
    return Vault(keyring("k1"))


def read(user_id: int, minute: int, **payloads: Any) -> UserUpdate:
    """A turn at T0 + `minute` that read `payloads` (endpoint with `_` for `-`)."""
    at = T0 + minute * MINUTE
    return UserUpdate(
        user_id=user_id,
        state="active",
        next_due_at=at + HOUR,
        consecutive_failures=0,
        last_outcome="ok",
        last_polled_at=at,
        snapshots=tuple(
            SnapshotWrite(endpoint=k.replace("_", "-"), status="ok", payload=p, fetched_at=at)  # type: ignore[arg-type]
            for k, p in payloads.items()
        ),
    )


def take(store: Store, cursor: int, user: str | None = None) -> tuple[int, list[tuple[Any, ...]]]:
    """The feed from `cursor` until it passed every row stored so far: the next cursor and
    (user, endpoint, payload) of each row.

    One call does it unless another session's transaction is open on the PostgreSQL server
    (a parallel test): the feed then stops below it until it ends, and is called again.
    """
    with store.database.read() as conn:
        newest = conn.execute(select(func.max(History.seq))).scalar() or 0
    rows: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + 30
    while True:
        feed = store.changed_since(cursor, user)
        rows += [(r.user, r.endpoint, r.payload) for r in feed.rows]
        assert feed.cursor >= cursor
        cursor = feed.cursor
        if cursor > newest:
            return cursor, rows
        assert time.monotonic() < deadline, "the feed never passed the newest row"
        time.sleep(0.01)


def test_each_change_once_in_the_order_stored(store: Store, vault: Vault) -> None:
    """From 0 every stored content; then, from each returned cursor, only what was stored
    since (a read of the same content is no change); the cursor never goes back."""
    a = enroll(store, vault, "a").id
    b = enroll(store, vault, "b").id
    store.apply([read(a, 1, latest_change={"v": 1}, stats={"s": 1})])
    store.apply([read(b, 1, latest_change={"v": 1})])
    c1, rows = take(store, 0)
    assert rows == [
        ("a", "latest-change", {"v": 1}),
        ("a", "stats", {"s": 1}),
        ("b", "latest-change", {"v": 1}),
    ]
    assert take(store, c1)[1] == []
    store.apply([read(a, 2, latest_change={"v": 1}, stats={"s": 2})])
    store.apply([read(b, 2, latest_change={"v": 2})])
    store.apply([read(b, 3, latest_change={"v": 3})])
    c2, rows = take(store, c1)
    assert rows == [
        ("a", "stats", {"s": 2}),
        ("b", "latest-change", {"v": 2}),
        ("b", "latest-change", {"v": 3}),
    ]
    assert c2 > c1
    assert take(store, c2)[1] == []
    assert len(take(store, 0)[1]) == 6


def test_one_users_changes_and_feed_after_forget(store: Store, vault: Vault) -> None:
    """`user` filters the rows, not the cursor; forgetting the user who stored the newest
    row does not hide the next change (SQLite would reuse that row's id)."""
    a = enroll(store, vault, "a").id
    b = enroll(store, vault, "b").id
    store.apply([read(a, 1, latest_change={"v": 1})])
    store.apply([read(b, 1, latest_change={"v": 1})])
    cursor, rows = take(store, 0, "b")
    assert rows == [("b", "latest-change", {"v": 1})]
    assert store.begin_drop("b", T0, purge=True).purged == 2
    store.apply([read(a, 2, latest_change={"v": 2})])
    assert take(store, cursor)[1] == [("a", "latest-change", {"v": 2})]


def test_a_negative_cursor_is_refused(store: Store) -> None:
    """A negative cursor is a ValueError that says what a cursor is."""
    with pytest.raises(ValueError, match="cursor"):
        store.changed_since(-1)


def test_feed_reads_in_batches(store: Store, vault: Vault) -> None:
    """More rows than a batch come out whole, in order (keyset over (seq, id))."""
    ids = [enroll(store, vault, f"u{i}").id for i in range(7)]
    for minute in (1, 2):
        store.apply([read(uid, minute, latest_change={"v": minute}) for uid in ids])
    take(store, 0)  # every write ended
    rows = list(store.changed_since(0, batch=3).rows)
    assert [(r.user, r.payload["v"]) for r in rows] == [
        (f"u{i}", minute) for minute in (1, 2) for i in range(7)
    ]
