"""The webhook outbox (docs/webhooks.md): each event is queued in the transaction of its
change, so it exists exactly when the change committed; delivered later, at least once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, and_, delete, func, insert, select, update

from lta_worker.domain import (
    OutboxCounts,
    PendingEvent,
    ResultChanged,
    ResultEvents,
    StateEvent,
    UserState,
    UserUpdate,
    turn_events,
)
from lta_worker.storage._apply import ResultChange
from lta_worker.storage._db import Queries
from lta_worker.storage._models import OutboxEvent, User

_ERROR_CHARS = 200


def record(conn: Connection, events: Iterable[StateEvent | ResultChanged | None]) -> int:
    """Queue `events` (None entries skipped) in the caller's transaction; return how many."""
    rows = [
        {
            "event_id": f"msg_{uuid.uuid4().hex}",
            "user": e.user,
            "type": e.type,
            "payload": e.payload(),
            "created_at": e.at,
            "next_attempt_at": e.at,
            "attempts": 0,
        }
        for e in events
        if e is not None
    ]
    if rows:
        conn.execute(insert(OutboxEvent), rows)
    return len(rows)


@dataclass(slots=True)
class Turns:
    """What the block of `watch_turns` wrote (`changes`: None when no `result.changed`)."""

    written: list[UserUpdate] = field(default_factory=list)
    changes: list[ResultChange] | None = None


@contextmanager
def watch_turns(
    conn: Connection,
    updates: Sequence[UserUpdate],
    now: datetime | None,
    results: ResultEvents = "hash",
) -> Iterator[Turns]:
    """Around the writes of a batch of turns: on a normal exit, queue the events of the
    turns the block appended to `written`, each followed by its `result.changed` events."""
    before: Mapping[int, Any] = {}
    if updates:
        rows = conn.execute(
            select(User.id, User.user, User.state, User.denied).where(
                User.id.in_({u.user_id for u in updates})
            )
        )
        before = {r.id: r for r in rows}
    turns = Turns(changes=None if results == "off" else [])
    yield turns
    by_turn: dict[int, list[ResultChange]] = {}
    for change in turns.changes or ():
        by_turn.setdefault(id(change.update), []).append(change)
    events: list[StateEvent | ResultChanged] = []
    # Two turns of one user in a batch: the second's "before" is what the first wrote.
    current = {uid: (r.user, cast(UserState, r.state), r.denied or {}) for uid, r in before.items()}
    for upd in turns.written:
        old = current.get(upd.user_id)
        if old is None:
            continue
        at = now or upd.last_polled_at or upd.next_due_at
        if at is None:  # storage never reads the clock: the caller says when
            raise ValueError("a turn's events need `now` or the update's last_polled_at")
        name, state, denied = old
        events += turn_events(name, state, denied, upd, at)
        current[upd.user_id] = (name, upd.state, dict(upd.denied))
        events += (
            ResultChanged(
                name,
                c.endpoint,
                c.status,
                c.content_hash,
                c.previous_hash,
                c.fetched_at,
                c.payload,
                with_content=results == "content",
            )
            for c in by_turn.pop(id(upd), ())
        )
    record(conn, events)


class OutboxQueries(Queries):
    """The delivery's side of the outbox: claim, acknowledge, back off, dead-letter, purge."""

    def claim_events(
        self, now: datetime, limit: int, lease_until: datetime, owner: str = "-"
    ) -> list[PendingEvent]:
        """Lease the oldest due live event of up to `limit` users to `owner` until `lease_until`."""
        table = OutboxEvent.__table__
        inner = table.alias().c
        head = (
            select(func.min(inner.id))
            .where(inner.user == OutboxEvent.user, inner.dead_at.is_(None))
            .scalar_subquery()
        )
        query = (
            select(table)
            .where(
                OutboxEvent.dead_at.is_(None),
                OutboxEvent.next_attempt_at <= now,
                OutboxEvent.id == head,
            )
            .order_by(OutboxEvent.id)
            .limit(limit)
            .with_for_update(skip_locked=True, of=table)
        )
        with self._db.write() as conn:
            rows = conn.execute(query).all()
            if not rows:
                return []
            conn.execute(
                update(OutboxEvent)
                .where(OutboxEvent.id.in_([r.id for r in rows]))
                .values(
                    next_attempt_at=lease_until,
                    attempts=OutboxEvent.attempts + 1,
                    lease_owner=owner,
                )
            )
            fields = ("id", "event_id", "user", "type", "payload", "created_at")
            return [
                PendingEvent(**{f: getattr(r, f) for f in fields}, attempts=r.attempts + 1)
                for r in rows
            ]

    def events_delivered(self, ids: Sequence[int]) -> int:
        """The receiver acknowledged these events: delete them; return how many."""
        if not ids:
            return 0
        with self._db.write() as conn:
            return conn.execute(delete(OutboxEvent).where(OutboxEvent.id.in_(ids))).rowcount

    def event_failed(self, event_id: int, retry_at: datetime, error: str) -> None:
        """The delivery failed: try again at `retry_at`; keep a short reason for `status`."""
        with self._db.write() as conn:
            conn.execute(
                update(OutboxEvent)
                .where(OutboxEvent.id == event_id)
                .values(next_attempt_at=retry_at, last_error=error[:_ERROR_CHARS], lease_owner=None)
            )

    def release_events(self, now: datetime) -> int:
        """Make every leased event due now (SQLite at start, under the instance lock); how many."""
        with self._db.write() as conn:
            return conn.execute(
                update(OutboxEvent)
                .where(OutboxEvent.lease_owner.is_not(None), OutboxEvent.dead_at.is_(None))
                .values(next_attempt_at=now, lease_owner=None)
            ).rowcount

    def dead_letter_events(self, now: datetime, max_age: timedelta) -> int:
        """Mark live events created more than `max_age` ago as dead; return how many."""
        with self._db.write() as conn:
            return conn.execute(
                update(OutboxEvent)
                .where(OutboxEvent.dead_at.is_(None), OutboxEvent.created_at < now - max_age)
                .values(dead_at=now)
            ).rowcount

    def purge_events(self, now: datetime, keep_dead: timedelta, *, live: bool = False) -> int:
        """Delete dead events older than `keep_dead` (and every live one when `live`)."""
        old_dead = and_(OutboxEvent.dead_at.is_not(None), OutboxEvent.dead_at < now - keep_dead)
        where = OutboxEvent.dead_at.is_(None) | old_dead if live else old_dead
        with self._db.write() as conn:
            return conn.execute(delete(OutboxEvent).where(where)).rowcount

    def outbox_counts(self) -> OutboxCounts:
        """Events waiting and dead-lettered, and when the oldest waiting one was made."""
        with self._db.read() as conn:
            rows = conn.execute(
                select(
                    OutboxEvent.dead_at.is_(None).label("live"),
                    func.count(),
                    func.min(OutboxEvent.created_at),
                ).group_by(OutboxEvent.dead_at.is_(None))
            ).all()
        found = {bool(live): (int(n), oldest) for live, n, oldest in rows}
        backlog, oldest = found.get(True, (0, None))
        dead, _ = found.get(False, (0, None))
        return OutboxCounts(backlog=backlog, dead=dead, oldest_at=oldest)
