"""What the freshness plan needs from the users table: rates by bucket, and a sample.

A pass plans the budget over every readable user (`domain.plan_scale`) with one GROUP BY on
the log-scale buckets each read stores (migration 0004), whatever the number of users; the
day's shape and the population's prior of the change rate come from the estimates of a
bounded sample.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, and_, func, select

from lta_worker.domain import ChangeEstimate
from lta_worker.storage._db import Queries
from lta_worker.storage._models import User

SAMPLE = 2000
"""Estimates read for the day's shape and the population's prior."""


def _readable() -> ColumnElement[bool]:
    return and_(User.token_ciphertext.is_not(None), User.state == "active")


class FreshnessQueries(Queries):
    """What the freshness plan reads of the users."""

    def rate_buckets(self) -> list[tuple[tuple[int, int], float]]:
        """Active users with a token, counted per (plan_bucket, rate_bucket).

        Users without an estimate yet count at the prior's buckets.
        """
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
        """Up to `limit` stored estimates of active users (the newest by id: the primary key's
        index, never a sort of the whole table)."""
        with self._db.read() as conn:
            rows = conn.execute(
                select(User.estimate)
                .where(_readable(), User.estimate.is_not(None))
                .order_by(User.id.desc())
                .limit(limit)
            ).scalars()
            found = [ChangeEstimate.from_json(raw) for raw in rows]
        return [est for est in found if est is not None]
