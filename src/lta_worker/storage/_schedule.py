"""Due times that follow the intervals in force (one set-based UPDATE per `due_class`), and
what the freshness plan reads (users per bucket, a bounded sample of estimates).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Interval, and_, func, literal, select, true, update

from lta_worker.domain import ChangeEstimate
from lta_worker.storage._db import Dialect, Queries, insert_for
from lta_worker.storage._models import ScheduleApplied, User

_ROW_ID = 1
BATCH = 20_000  # users rewritten per transaction (by id range)
SAMPLE = 2000  # estimates read for the day's shape and the population's prior


def _plus(dialect: Dialect, seconds: float) -> ColumnElement[Any]:
    if dialect == "postgresql":
        return User.last_polled_at + literal(timedelta(seconds=seconds), Interval())
    # SQLite stores 'YYYY-MM-DD HH:MM:SS.ffffff'; strftime's %f gives milliseconds.
    shifted = func.strftime("%Y-%m-%d %H:%M:%f", User.last_polled_at, f"+{seconds} seconds")
    return shifted.concat("000")


def _earliest(dialect: Dialect, due: ColumnElement[Any]) -> ColumnElement[Any]:
    if dialect == "postgresql":
        return func.least(User.next_due_at, due)
    return func.min(User.next_due_at, due)  # SQLite's two-argument min is a scalar


# An adaptive due time this close above last_polled_at + the interval is at the floor
# (SQLite's date arithmetic keeps milliseconds; a second is far below any plan's step).
FLOOR_SLACK_S = 1.0


def _readable() -> ColumnElement[bool]:
    return and_(User.token_ciphertext.is_not(None), User.state == "active")


class ScheduleQueries(Queries):
    """Due times that follow the intervals in force, and what the freshness plan reads."""

    def follow_schedule(
        self,
        interval: timedelta,
        parked_interval: timedelta,
        now: datetime,
        *,
        force: bool = False,
        floor: timedelta | None = None,
    ) -> dict[str, int] | None:
        """Recompute due times by class when the intervals differ from those last applied
        (`force`: anyway, `floor` the longest interval this instance planned adaptive users
        with); the users rescheduled per class, or None. Each step is idempotent.
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

    def rate_buckets(self) -> list[tuple[tuple[int, int], float]]:
        """Active users with a token per (plan_bucket, rate_bucket); no estimate: the prior's."""
        prior = ChangeEstimate().buckets()
        counts: dict[tuple[int, int], float] = {}
        with self._db.read() as conn:
            rows = conn.execute(
                select(User.plan_bucket, User.rate_bucket, func.count())
                .where(_readable())
                .group_by(User.plan_bucket, User.rate_bucket)
            ).all()
        for plan, rate, count in rows:
            key = (plan, rate) if plan is not None and rate is not None else prior
            counts[key] = counts.get(key, 0.0) + float(count)
        return sorted(counts.items())

    def sample_estimates(self, limit: int = SAMPLE) -> list[ChangeEstimate]:
        """Up to `limit` stored estimates of active users, newest by id (no whole-table sort)."""
        with self._db.read() as conn:
            rows = conn.execute(
                select(User.estimate)
                .where(_readable(), User.estimate.is_not(None))
                .order_by(User.id.desc())
                .limit(limit)
            ).scalars()
            found = [ChangeEstimate.from_json(raw) for raw in rows]
        return [est for est in found if est is not None]
