"""The change feed (docs/operations.md, *Exports, history and retention*).

Each history row and forget line carries `seq`, its writing transaction's number; a reader
takes `cursor <= seq < bound`, below which every writing transaction has ended (PostgreSQL:
the oldest running xid plus `pg_offset`; SQLite: a counter bumped under the write lock,
never below the clock in microseconds). A cursor `HISTORY_ID.BOUND` names one database.
"""

from __future__ import annotations

import heapq
import re
import secrets
from typing import Any, Final

from sqlalchemy import Connection, func, literal_column, select, union_all, update
from sqlalchemy.exc import DBAPIError

from lta_worker.domain import ChangeFeed, UserForgotten
from lta_worker.errors import CursorError
from lta_worker.storage._db import Database, Dialect, Queries
from lta_worker.storage._models import FeedCounter, FeedGone, History
from lta_worker.storage._results import result_row, stored_results

# xid8 has no cast to bigint but through text.
_PG_XACT: Final = "pg_current_xact_id()::text::bigint"
_PG_BOUND: Final = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
_PG_NEXT: Final = "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
_PG_OFFSET: Final = "coalesce((SELECT pg_offset FROM feed_counter WHERE id = 1), 0)"
_PG_SYSTEM: Final = "(SELECT system_identifier::text FROM pg_control_system())"
_SQLITE_NOW_US: Final = "CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)"
_CURSOR: Final = re.compile(r"([0-9a-f]{1,32})\.([0-9]{1,19})")
_MAX_SEQ: Final = 2**63 - 1


def write_seq(conn: Connection, dialect: Dialect) -> Any:
    """The `seq` of feed rows this transaction writes (call once per write to the feed)."""
    if dialect == "postgresql":
        return literal_column(f"({_PG_XACT} + {_PG_OFFSET})")
    value = FeedCounter.__table__.c.value
    bumped = conn.execute(
        update(FeedCounter)
        .where(FeedCounter.id == 1)
        .values(value=func.max(value + 1, literal_column(_SQLITE_NOW_US)))
        .returning(value)
    ).scalar_one_or_none()
    if bumped is None:  # a database made from the models, not the migrations
        first = int(conn.execute(select(literal_column(_SQLITE_NOW_US))).scalar_one())
        conn.execute(
            FeedCounter.__table__.insert().values(
                id=1, value=first, history_id=secrets.token_hex(8)
            )
        )
        return first
    return int(bumped)


def _position(conn: Connection, dialect: Dialect) -> tuple[str, int]:
    """This database's history id, and the bound."""
    row = conn.execute(
        select(FeedCounter.history_id, FeedCounter.value, FeedCounter.pg_offset).where(
            FeedCounter.id == 1
        )
    ).first()
    history = (row.history_id if row is not None else None) or "0"
    if dialect == "postgresql":
        offset = row.pg_offset if row is not None else 0
        return history, int(conn.execute(select(literal_column(_PG_BOUND))).scalar_one()) + offset
    return history, (int(row.value) if row is not None else 0) + 1


def follow_cluster(db: Database) -> bool:
    """PostgreSQL, after a restore into another cluster: a new history id and an offset
    numbering new rows above the stored ones; True when it did. No-op on SQLite."""
    if db.dialect != "postgresql":
        return False
    with db.write() as conn:
        row = conn.execute(
            select(FeedCounter.pg_system, FeedCounter.pg_offset)
            .where(FeedCounter.id == 1)
            .with_for_update()
        ).first()
        if row is None:
            return False
        system = _cluster(conn)
        nxt = int(conn.execute(select(literal_column(_PG_NEXT))).scalar_one())
        seqs = union_all(select(func.max(History.seq)), select(func.max(FeedGone.seq))).subquery()
        newest = int(conn.execute(select(func.max(seqs.c[0]))).scalar() or 0)
        moved = None not in (row.pg_system, system) and row.pg_system != system
        if not moved and newest < nxt + row.pg_offset:
            if row.pg_system is None:
                conn.execute(update(FeedCounter).values(pg_system=system))
            return False
        conn.execute(
            update(FeedCounter).values(
                pg_system=system or row.pg_system,
                pg_offset=max(row.pg_offset, newest - nxt + 1),
                history_id=secrets.token_hex(8),
            )
        )
    return True


def _cluster(conn: Connection) -> str | None:
    """The cluster's system identifier, or None where the role may not read it."""
    try:
        with conn.begin_nested():
            return str(conn.execute(select(literal_column(_PG_SYSTEM))).scalar_one())
    except DBAPIError:
        return None


def parse_cursor(cursor: str | int, history: str, bound: int) -> int:
    """The position a cursor names in this history (`0`: the start); else CursorError."""
    text = str(cursor).strip()
    if text == "0":
        return 0
    if text.isdigit():
        raise CursorError(
            f"cursor {text[:24]!r} is a plain number, as lta-worker printed before cursors "
            "named their database: it cannot show that it came from this one",
            reason="legacy",
        )
    found = _CURSOR.fullmatch(text)
    if found is None or int(found[2]) > _MAX_SEQ:
        raise CursorError(
            f"{text[:80]!r} is not a cursor this feed printed (a cursor is 0 or the "
            '"cursor" of the last line of a previous export)',
            reason="malformed",
        )
    if found[1] != history:
        raise CursorError(
            "the cursor comes from another database's history (or from before this "
            "database was restored into another PostgreSQL cluster)",
            reason="other_database",
        )
    position = int(found[2])
    if position > bound:
        raise CursorError(
            "the cursor is ahead of everything this database stored: it never issued it "
            "(forged, or kept from before a restore from an older backup)",
            reason="ahead",
        )
    return position


class FeedQueries(Queries):
    """The change feed of `results export --changed-since`."""

    def changed_since(
        self, cursor: str | int, user: str | None = None, batch: int = 500
    ) -> ChangeFeed:
        """The results and `UserForgotten` lines stored at or after `cursor`, and the next
        cursor; CursorError for a cursor this database never issued."""
        with self._db.read() as conn:
            history, bound = _position(conn, self._db.dialect)
        after = parse_cursor(cursor, history, bound)
        results = stored_results(History, History.id, History.seq, user=user)
        results = results.where(History.seq < bound)
        gone = select(FeedGone.id, FeedGone.seq, FeedGone.user, FeedGone.reason, FeedGone.at)
        gone = gone.where(FeedGone.seq < bound)
        if user is not None:
            gone = gone.where(FeedGone.user == user)
        rows = heapq.merge(
            self._db.pages(results, (History.seq, History.id), (after, 0), batch),
            self._db.pages(gone, (FeedGone.seq, FeedGone.id), (after, 0), batch),
            key=lambda row: row.seq,
        )
        return ChangeFeed(
            f"{history}.{bound}",
            (
                result_row(row, changed_at=row.fetched_at)
                if hasattr(row, "endpoint")
                else UserForgotten(row.user, row.reason, row.at)
                for row in rows
            ),
        )


def record_gone(conn: Connection, dialect: Dialect, users: list[str], reason: str, at: Any) -> None:
    """Write a feed line per user whose results were just purged."""
    if not users:
        return
    insert = FeedGone.__table__.insert().values(seq=write_seq(conn, dialect))
    conn.execute(insert, [{"user": u, "reason": reason, "at": at} for u in users])
