"""The freshness plan a pass uses (`PlanCache`): made from what the store holds, renewed
every few minutes (the plan's arithmetic is the domain's: tests/domain/test_freshness.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lta_worker.config import build_settings
from lta_worker.domain import ChangeEstimate, FreshnessConfig, PolicyConfig, SchedulePlan
from lta_worker.report import PlanCache
from lta_worker.report._plan import REPLAN

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
ADAPTIVE = FreshnessConfig(
    schedule="adaptive",
    interval=timedelta(minutes=15),
    max_interval=timedelta(hours=24),
    stats="on_change",
    stats_max_age=timedelta(hours=24),
)


class FakeStore:
    """What `plan_for_pass` reads of the store, counting the scans of the users table."""

    def __init__(self) -> None:
        self.scans = 0

    def budget_seen(self, client_id: str) -> None:
        return None

    def count_by_state(self) -> dict[str, int]:
        return {"active": 100, "parked": 4}

    def rate_buckets(self) -> list[tuple[tuple[int, int], float]]:
        self.scans += 1
        return [(ChangeEstimate().buckets(), 100.0)]

    def sample_estimates(self) -> list[ChangeEstimate]:
        return [ChangeEstimate()]


def test_the_plan_is_made_from_the_store_and_renewed_every_few_minutes() -> None:
    """Under `adaptive` the plan comes from the stored buckets and the fallback budget, is
    reused for `REPLAN`, then made again; under `fixed` the store is not read at all."""
    settings = build_settings(
        {
            "service": {"base_url": "https://api.example", "auth_url": "https://a.example"},
            "client": {"id": "c"},
            "poll": {"schedule": "adaptive", "interval": "15m"},
            "ratelimit": {"fallback_per_hour": 20.0},
        }
    )
    policy = PolicyConfig.from_settings(settings.poll)
    store, cache = FakeStore(), PlanCache()
    plan = cache.get(store, settings, policy, NOW)  # type: ignore[arg-type]
    assert plan.scale > 0  # 20 reads an hour cannot read 100 users every 15 minutes
    assert plan.budget_per_hour == pytest.approx(20.0 - 4 / 24)
    assert cache.get(store, settings, policy, NOW + REPLAN / 2) is plan  # type: ignore[arg-type]
    cache.get(store, settings, policy, NOW + REPLAN)  # type: ignore[arg-type]
    assert store.scans == 2
    assert plan.expected_delay_s is not None
    assert plan.expected_delay_s > ADAPTIVE.interval.total_seconds() / 2
    fixed = PolicyConfig()
    assert PlanCache().get(None, settings, fixed, NOW) == SchedulePlan()  # type: ignore[arg-type]
