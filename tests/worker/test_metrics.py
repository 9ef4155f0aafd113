"""The worker's metrics registry: figures set from what the pass and its plan report."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lta_worker.domain import BudgetSeen, SchedulePlan
from lta_worker.worker._metrics import Metrics

DELAY = "lta_worker_schedule_expected_delay_seconds"


def _value(metrics: Metrics, name: str) -> float:
    text = generate_latest(metrics.registry).decode()
    found = [
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    ]
    assert len(found) == 1, found
    return float(found[0])


def test_the_expected_delay_follows_the_adaptive_plan() -> None:
    """The expected delay is NaN (unknown) until a plan gives a figure, then that figure; a
    plan without one (`fixed` after a reload, or no active users) makes it NaN again."""
    metrics = Metrics()
    assert math.isnan(_value(metrics, DELAY))
    metrics.on_plan(SchedulePlan())
    assert math.isnan(_value(metrics, DELAY))
    metrics.on_plan(SchedulePlan(expected_delay_s=1800.0))
    assert _value(metrics, DELAY) == 1800.0
    metrics.on_plan(SchedulePlan())
    assert math.isnan(_value(metrics, DELAY))


NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seen", "remaining", "limit"),
    [
        (None, math.nan, math.nan),
        (BudgetSeen(None, None, None, None, NOW), math.nan, math.nan),
        (BudgetSeen(120, 113, NOW + timedelta(minutes=20), 3600, NOW), 113.0, 120.0),
        (BudgetSeen(120, 7, NOW - timedelta(seconds=1), 3600, NOW), 120.0, 120.0),
        (BudgetSeen(120, None, NOW + timedelta(minutes=20), 3600, NOW), math.nan, 120.0),
        (BudgetSeen(0, 0, NOW + timedelta(minutes=20), 3600, NOW), 0.0, 0.0),
    ],
    ids=["nothing-recorded", "no-limit", "window-open", "window-reset", "remaining-unknown", "0"],
)
def test_the_budget_gauges_start_from_what_the_database_recorded(
    seen: BudgetSeen | None, remaining: float, limit: float
) -> None:
    """At start the budget gauges take the recorded limit and what was left, the whole limit
    once the recorded window has reset, and stay unknown (NaN, never 0: a limit of 0 is a
    budget) when no limit was recorded."""
    metrics = Metrics()
    metrics.on_budget_seen(seen, NOW)
    assert _value(metrics, "lta_worker_budget_remaining") == pytest.approx(remaining, nan_ok=True)
    assert _value(metrics, "lta_worker_budget_limit") == pytest.approx(limit, nan_ok=True)
