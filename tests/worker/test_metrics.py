"""The worker's metrics registry: figures set from what the pass and its plan report."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

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
    """The expected delay is the plan's figure, NaN while no plan gives one."""
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
    """At start the budget gauges take what was recorded (NaN, never 0, when nothing was)."""
    metrics = Metrics()
    metrics.on_budget_seen(seen, NOW)
    assert _value(metrics, "lta_worker_budget_remaining") == pytest.approx(remaining, nan_ok=True)
    assert _value(metrics, "lta_worker_budget_limit") == pytest.approx(limit, nan_ok=True)


@pytest.mark.parametrize(
    ("stopped", "counts", "success", "trip"),
    [
        ("breaker", {"none": 3}, 0.0, 1.0),  # stopped by the 404 breaker: read nothing
        ("breaker", {"rejected": 2}, 0.0, 1.0),
        ("completed", {"none": 1}, 1.0, 0.0),
        ("completed", {"transient": 1}, 0.0, 0.0),
    ],
)
def test_a_pass_stopped_by_the_breaker_is_no_success_and_sets_the_trip_time(
    stopped: str, counts: dict[str, int], success: float, trip: float
) -> None:
    """A breaker-stopped pass is no success and sets the trip time; a completed one is."""
    from collections import Counter

    from lta_worker.worker import PassResult

    metrics = Metrics()
    ended = datetime.fromtimestamp(1.0, UTC)
    metrics.on_pass(PassResult(stopped, 0, reads=3, counts=Counter(counts)), ended)  # type: ignore[arg-type]
    assert _value(metrics, "lta_worker_last_pass_success_timestamp_seconds") == success
    assert _value(metrics, "lta_worker_breaker_last_trip_timestamp_seconds") == trip


def test_textfile_counters_continue_from_the_last_run(tmp_path: Path) -> None:
    """The textfile's counters go on from the last run's file (0 when missing or not metrics)."""
    path = tmp_path / "lta.prom"
    for run in range(1, 4):
        metrics = Metrics()
        metrics.resume_counters(path)
        metrics.breaker_trips.inc()
        metrics.on_read("latest-change", "revoked", 0.1)
        metrics.write_textfile(path)
        assert _value(metrics, "lta_worker_breaker_trips_total") == run
    revoked = 'lta_worker_reads_total{endpoint="latest-change",outcome="revoked"} 3.0'
    assert revoked in path.read_text()
    path.write_text("not metrics {\n")
    fresh = Metrics()
    fresh.resume_counters(path)
    assert _value(fresh, "lta_worker_breaker_trips_total") == 0
