"""The change feed: the results stored after a cursor, and the cursor to pass next time.

Each history row (a content that differs from the one stored before it) carries `seq`, the
number of the transaction that wrote it, and a reader takes the rows with `cursor <= seq <
bound`, where `bound` is a number below which every writing transaction has ended:

- PostgreSQL: `seq` is the writing transaction's id (`pg_current_xact_id()`, the top-level
  one even under a SAVEPOINT), and `bound` the oldest transaction still running when the
  reader looks (`pg_snapshot_xmin(pg_current_snapshot())`). A transaction that took its id
  before another but commits after it is still running at the reader's look, so its rows
  are not skipped: the reader stops below it and returns them next time. Ids grow across
  every connection of the server, so two instances and a clock step change nothing; a
  transaction left open for long only delays the feed.
- SQLite: one writer at a time; each write that appends history takes the next value of
  `feed_counter` in its own transaction, and `bound` is the counter's value plus one.

`bound` is read before the rows: every row below it is committed by then, so the rows can be
read in batches, each in a transaction of its own. Rows older than the feed have seq 0.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import ColumnElement, Connection, literal_column, select, update

from lta_worker.domain import ChangeFeed
from lta_worker.storage._db import Dialect, Queries
from lta_worker.storage._models import FeedCounter, History, User
from lta_worker.storage._results import result_row

# The writing transaction's id as a number (xid8 has no cast to bigint but through text).
_PG_XACT: Final = "pg_current_xact_id()::text::bigint"
_PG_BOUND: Final = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint"


def write_seq(conn: Connection, dialect: Dialect) -> ColumnElement[int] | int:
    """The `seq` of history rows this transaction writes (call once per write of history)."""
    if dialect == "postgresql":
        return literal_column(_PG_XACT)
    value = FeedCounter.__table__.c.value
    bumped = conn.execute(
        update(FeedCounter).where(FeedCounter.id == 1).values(value=value + 1).returning(value)
    ).scalar_one_or_none()
    if bumped is None:  # a database made from the models, not the migrations
        conn.execute(FeedCounter.__table__.insert().values(id=1, value=1))
        return 1
    return int(bumped)


def _bound(conn: Connection, dialect: Dialect) -> int:
    """Every transaction numbered below this has ended (committed or rolled back)."""
    if dialect == "postgresql":
        return int(conn.execute(select(literal_column(_PG_BOUND))).scalar_one())
    value = conn.execute(select(FeedCounter.value).where(FeedCounter.id == 1)).scalar()
    return int(value or 0) + 1


class FeedQueries(Queries):
    """The change feed of `results export --changed-since`."""

    def changed_since(self, cursor: int, user: str | None = None, batch: int = 500) -> ChangeFeed:
        """The results stored at or after `cursor` (0: all; of one user when given), oldest
        first, and the cursor to pass next time.

        Raises:
            ValueError: a negative cursor.
        """
        if cursor < 0:
            raise ValueError("a cursor is 0 or a number a previous export printed")
        with self._db.read() as conn:
            bound = _bound(conn, self._db.dialect)
        query = (
            select(
                History.id,
                History.seq,
                User.user,
                History.endpoint,
                History.status,
                History.payload,
                History.fetched_at,
                User.state,
            )
            .join(User, User.id == History.user_id)
            .where(History.seq < bound)
        )
        if user is not None:
            query = query.where(User.user == user)
        rows = self._db.pages(query, (History.seq, History.id), (cursor, 0), batch)
        return ChangeFeed(
            max(cursor, bound), (result_row(row, changed_at=row.fetched_at) for row in rows)
        )
