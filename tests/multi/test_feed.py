"""The change feed over two instances on PostgreSQL: writes from two connections, some committed
out of order, reach a reader following its cursor exactly once (a sequence id would lose them)."""

from __future__ import annotations

import random
import time
from collections import Counter
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from lta_worker.domain import EncryptedToken, ResultRow, SnapshotWrite, UserUpdate
from lta_worker.storage import History, Store
from lta_worker.storage._apply import write_batch
from support.storage import position

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def read(user_id: int, step: int) -> UserUpdate:
    """A turn at step `step` that read a content of its own (so each is a change)."""
    at = T0 + timedelta(seconds=step)
    return UserUpdate(
        user_id=user_id,
        state="active",
        next_due_at=at + timedelta(hours=1),
        consecutive_failures=0,
        last_outcome="ok",
        last_polled_at=at,
        snapshots=(
            SnapshotWrite(
                endpoint="latest-change", status="ok", payload={"n": step}, fetched_at=at
            ),
        ),
    )


class Reader:
    """An application following the feed: keeps its cursor, counts every row it got."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.cursor: str | int = 0
        self.got: Counter[tuple[str, int]] = Counter()

    def call(self) -> None:
        feed = self.store.changed_since(self.cursor)
        for row in feed.rows:
            assert isinstance(row, ResultRow)
            self.got[(row.user, row.payload["n"])] += 1
        assert position(feed.cursor) >= position(self.cursor)
        self.cursor = feed.cursor


def stored(store: Store) -> Counter[tuple[str, int]]:
    """Every content in the history, by (user, step)."""
    from lta_worker.storage import User

    with store.database.read() as conn:
        rows = conn.execute(
            select(User.user, History.payload).join(User, User.id == History.user_id)
        ).all()
    return Counter((r.user, r.payload["n"]) for r in rows)


def enroll(store: Store, user: str) -> int:
    """A user with a (dummy) token; its row id."""
    token = EncryptedToken(ciphertext=b"x" * 40, key_id="k1")
    store.store_token(user, token, ["cloud-sync.permanent.latest-change"], T0, T0)
    row = store.get_user(user)
    assert row is not None
    return row.id


def drain(reader: Reader, expected: Counter[tuple[str, int]]) -> None:
    """Call the feed until it returned `expected` (an open transaction delays rows, never loses)."""
    deadline = time.monotonic() + 30
    while reader.got != expected:
        assert all(n == 1 for n in reader.got.values()), "a row came twice"
        assert time.monotonic() < deadline, sorted(set(expected) - set(reader.got))
        reader.call()
        time.sleep(0.01)


def test_two_instances_interleaved_writes_come_exactly_once(pg_url: str) -> None:
    """Random interleavings of two instances' writes, held and committed in any order: each once."""
    rng = random.Random(30)
    with Store.open(pg_url) as one, Store.open(pg_url) as two:
        users = {
            store: [enroll(store, f"{name}{i}") for i in range(4)]
            for store, name in ((one, "a"), (two, "b"))
        }
        reader = Reader(one)
        with ExitStack() as outer:
            held: list[tuple[ExitStack, int]] = []  # open transactions, the user each locks
            out_of_order = 0  # commits made while an earlier write was still open
            for step in range(1, 81):
                store = rng.choice((one, two))
                free = [u for u in users[store] if u not in {uid for _, uid in held}]
                action = rng.random()
                if action < 0.3 and len(held) < 4 and free:
                    stack = outer.enter_context(ExitStack())
                    conn = stack.enter_context(store.database.write())
                    uid = rng.choice(free)
                    write_batch(conn, "postgresql", [read(uid, step)], None, None)
                    held.append((stack, uid))
                elif action < 0.55 and held:
                    n = rng.randrange(len(held))
                    out_of_order += n > 0
                    held.pop(n)[0].close()  # commits, in an order of its own
                elif free:
                    out_of_order += bool(held)
                    store.apply([read(rng.choice(free), step)])
                reader.call()
            for stack, _ in held:
                stack.close()
        expected = stored(one)
        assert sum(expected.values()) > 30 and out_of_order > 0
        drain(reader, expected)
