"""Keep due times following the intervals in force (`poll.interval`, `poll.parked_interval`).

A user read at T is due at T + the interval in force now. Each user records which setting
its `next_due_at` derives from (`users.due_class`, see `policy.DUE_CLASSES`), and
`schedule_applied` the intervals the due times were last computed with. When `run` or
`serve` starts a pass with other intervals, every class is recomputed with one set-based
UPDATE each:

- `interval` / `parked`: due at last_polled_at + the new interval (a lower one makes users
  due at once; a higher one moves them later, spread as their reads were);
- `backoff` / `backoff_parked`: the backoff kept, but never later than last_polled_at + the
  new cap;
- `adaptive`: `interval` is the floor of the freshness schedule's due times. A user at the
  old floor (the budget covered it at `interval`: the plan's scale was 0) is due at
  last_polled_at + the new interval, as under `interval`; one above both floors keeps its
  due time, set by its estimate and the budget (a new plan applies at its next read).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Interval, and_, func, literal, select, true, update

from lta_worker.storage._db import Dialect, Queries, insert_for
from lta_worker.storage._models import ScheduleApplied, User

_ROW_ID = 1
BATCH = 20_000
"""Users rewritten per transaction (by id range)."""


def _plus(dialect: Dialect, seconds: float) -> ColumnElement[Any]:
    """last_polled_at + `seconds`, in the backend's own date arithmetic."""
    if dialect == "postgresql":
        return User.last_polled_at + literal(timedelta(seconds=seconds), Interval())
    # SQLite stores 'YYYY-MM-DD HH:MM:SS.ffffff'; strftime's %f gives milliseconds.
    shifted = func.strftime("%Y-%m-%d %H:%M:%f", User.last_polled_at, f"+{seconds} seconds")
    return shifted.concat("000")


def _earliest(dialect: Dialect, due: ColumnElement[Any]) -> ColumnElement[Any]:
    """The earlier of the current next_due_at and `due`."""
    if dialect == "postgresql":
        return func.least(User.next_due_at, due)
    return func.min(User.next_due_at, due)  # SQLite's two-argument min is a scalar


# An adaptive due time this close above last_polled_at + the interval is at the floor
# (SQLite's date arithmetic keeps milliseconds; a second is far below any plan's step).
FLOOR_SLACK_S = 1.0


class ScheduleQueries(Queries):
    """Due times that follow the intervals in force."""

    def follow_schedule(
        self,
        interval: timedelta,
        parked_interval: timedelta,
        now: datetime,
        *,
        force: bool = False,
        floor: timedelta | None = None,
    ) -> dict[str, int] | None:
        """Recompute due times by class when the intervals differ from those last applied.

        The users are rewritten in id ranges of `BATCH`, one short transaction each, so that
        other writers (a lifecycle command, another instance) never wait for the whole table;
        the intervals are recorded last. Every step is idempotent: a run stopped half-way
        recomputes everything at the next start. Returns None when nothing changed, else the
        number of users rescheduled per class. With `force`, the due times are recomputed
        even when the intervals are those last applied: after a reload, this instance may have
        written due times under its old intervals since another instance applied the new ones;
        `floor` is then the longest interval it wrote them with (the floor of its adaptive due
        times, beside the one last applied).
        """
        wanted = (interval.total_seconds(), parked_interval.total_seconds())
        with self._db.read() as conn:
            applied = conn.execute(
                select(ScheduleApplied.interval_s, ScheduleApplied.parked_interval_s).where(
                    ScheduleApplied.id == _ROW_ID
                )
            ).first()
            last_id = conn.execute(select(func.max(User.id))).scalar_one_or_none() or 0
        if not force and applied is not None and tuple(applied) == wanted:
            return None
        # Also when nothing was recorded yet (a database from before 0003): with unchanged
        # intervals it rewrites the same due times.
        readable = and_(
            User.token_ciphertext.is_not(None),
            User.last_polled_at.is_not(None),
            User.next_due_at.is_not(None),
            User.state != "dropping",
        )
        dialect = self._db.dialect
        every, parked = (_plus(dialect, s) for s in wanted)
        # Adaptive users at or below the highest floor their due times may have been set
        # with (the one applied, this instance's, the new one) are at the new floor; the
        # others keep theirs, which is above it.
        floors = [wanted[0], *(() if applied is None else (applied[0],))]
        highest = max(*floors, floor.total_seconds() if floor is not None else 0.0)
        plans = {
            "interval": every,
            "parked": parked,
            "backoff": _earliest(dialect, every),
            "backoff_parked": _earliest(dialect, parked),
            "adaptive": every,
        }
        only = {"adaptive": User.next_due_at <= _plus(dialect, highest + FLOOR_SLACK_S)}
        counts = dict.fromkeys(plans, 0)
        for low in range(0, last_id, BATCH):
            in_range = and_(User.id > low, User.id <= low + BATCH)
            with self._db.write() as conn:
                for due_class, due in plans.items():
                    result = conn.execute(
                        update(User)
                        .where(in_range, readable, User.due_class == due_class)
                        .where(only.get(due_class, true()))
                        .values(next_due_at=due)
                    )
                    counts[due_class] += result.rowcount
        values = {"interval_s": wanted[0], "parked_interval_s": wanted[1], "applied_at": now}
        with self._db.write() as conn:
            found = conn.execute(
                update(ScheduleApplied).where(ScheduleApplied.id == _ROW_ID).values(**values)
            )
            if found.rowcount == 0:  # first time; another instance may be doing the same
                insert = insert_for(dialect, ScheduleApplied).values(id=_ROW_ID, **values)
                conn.execute(insert.on_conflict_do_nothing())
        return counts
