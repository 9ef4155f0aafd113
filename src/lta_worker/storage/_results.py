"""Snapshots (latest result per user and endpoint), history, export and retention purge.

Payloads are stored as received; the content hash is over canonical JSON (key order and
spacing do not count), and history gets a row only when (status, hash) changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, Select, and_, delete, func, or_, select

from lta_worker.domain import (
    Endpoint,
    HistoryRow,
    PurgeCounts,
    ResultRow,
    ResultStatus,
    UserState,
    canonical_json,
)
from lta_worker.storage._db import Queries
from lta_worker.storage._models import History, Snapshot, User


def content_hash(payload: Any, content: bytes | None = None) -> str:
    """The sha256 (hex) of the payload's canonical JSON form (`content` when known)."""
    return hashlib.sha256(content if content is not None else canonical_json(payload)).hexdigest()


def result_row(row: Any, *, changed_at: datetime) -> ResultRow:
    """A stored result (a snapshot, or a history row with its own fetch time) as a record."""
    return ResultRow(
        user=row.user,
        endpoint=cast(Endpoint, row.endpoint),
        status=cast(ResultStatus, row.status),
        payload=row.payload,
        fetched_at=row.fetched_at,
        changed_at=changed_at,
        state=cast(UserState, row.state),
    )


def stored_results(table: Any, *columns: Any, user: str | None = None) -> Select[Any]:
    """The results stored in `table` (`Snapshot`, `History`) with `columns`, of `user` if given."""
    query = select(
        *columns, User.user, table.endpoint, table.status, table.payload, table.fetched_at
    ).add_columns(User.state)
    query = query.join(User, User.id == table.user_id)
    return query if user is None else query.where(User.user == user)


class ResultQueries(Queries):
    """Stored results: the latest per (user, endpoint), every past content, one user's purge."""

    def export_results(self, user: str | None = None, batch: int = 500) -> Iterator[ResultRow]:
        """The latest result per user and endpoint (of one user when given), in batches."""
        query = stored_results(Snapshot, Snapshot.user_id, Snapshot.changed_at, user=user)
        keys = (Snapshot.user_id, Snapshot.endpoint)
        for row in self._db.pages(query, keys, (0, ""), batch):
            yield result_row(row, changed_at=row.changed_at)

    def export_history(
        self, user: str | None = None, since: datetime | None = None, batch: int = 500
    ) -> Iterator[ResultRow]:
        """Every stored past content (of `user`, fetched at or after `since`), in the order
        stored; `changed_at` is the storing read's `fetched_at`."""
        query = stored_results(History, History.id, user=user)
        if since is not None:
            query = query.where(History.fetched_at >= since)
        for row in self._db.pages(query, (History.id,), (0,), batch):
            yield result_row(row, changed_at=row.fetched_at)

    def history(self, user: str, endpoint: Endpoint) -> list[HistoryRow]:
        """Every distinct content stored for (user, endpoint), oldest first; [] when none."""
        with self._db.read() as conn:
            rows = conn.execute(
                select(
                    History.endpoint,
                    History.status,
                    History.payload,
                    History.content_hash,
                    History.fetched_at,
                )
                .join(User, User.id == History.user_id)
                .where(User.user == user, History.endpoint == endpoint)
                .order_by(History.fetched_at, History.id)
            ).all()
        return [HistoryRow(**r._mapping) for r in rows]


def purge_user(conn: Connection, user_id: int) -> int:
    """Delete one user's snapshots and history in the caller's transaction; how many rows."""
    snapshots = conn.execute(delete(Snapshot).where(Snapshot.user_id == user_id)).rowcount
    past = conn.execute(delete(History).where(History.user_id == user_id)).rowcount
    return int(snapshots + past)


def purge_expired_results(
    conn: Connection, now: datetime, after: timedelta
) -> tuple[PurgeCounts, list[str]]:
    """Delete results of users revoked or dropped at least `after` ago; counts and users."""
    cutoff = now - after
    expired = select(User.id).where(
        or_(
            and_(User.state == "revoked", User.revoked_at <= cutoff),
            and_(User.state == "dropped", User.dropped_at <= cutoff),
        )
    )
    with_rows = (
        select(Snapshot.user_id)
        .where(Snapshot.user_id.in_(expired))
        .union(select(History.user_id).where(History.user_id.in_(expired)))
        .subquery()
    )
    found = conn.execute(
        select(User.id, User.user).where(User.id.in_(select(with_rows.c.user_id)))
    ).all()
    if not found:
        return PurgeCounts(), []
    users = [r.id for r in found]
    snapshots = conn.execute(delete(Snapshot).where(Snapshot.user_id.in_(users))).rowcount
    past = conn.execute(delete(History).where(History.user_id.in_(users))).rowcount
    counts = PurgeCounts(users=len(users), snapshots=snapshots, history=past)
    return counts, [r.user for r in found]


def prune_history(conn: Connection, now: datetime, keep: timedelta) -> int:
    """Delete past contents fetched over `keep` ago but each (user, endpoint)'s newest; count."""
    newest = select(func.max(History.id)).group_by(History.user_id, History.endpoint)
    stmt = delete(History).where(History.fetched_at < now - keep, History.id.not_in(newest))
    return conn.execute(stmt).rowcount
