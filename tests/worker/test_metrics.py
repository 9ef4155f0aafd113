"""The worker's metrics registry: figures set from what the pass and its plan report."""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lta_worker.domain import BudgetSeen, OutboxCounts, SchedulePlan
from lta_worker.worker import PassResult
from lta_worker.worker._metrics import Metrics

DELAY = "lta_worker_schedule_expected_delay_seconds"
SUCCESS = "lta_worker_last_pass_success_timestamp_seconds"
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


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
        ("breaker", {"none": 3}, False, True),  # stopped by the 404 breaker: read nothing
        ("breaker", {"rejected": 2}, False, True),
        ("completed", {}, False, False),
        ("completed", {"transient": 6}, False, False),
        ("upstream_down", {"transient": 20}, False, False),
        ("completed", {"ok": 1, "transient": 5}, True, False),
        ("completed", {"none": 1}, True, False),
        ("deadline", {"none": 2}, True, False),
    ],
)
def test_last_success_moves_only_for_a_pass_with_an_answered_read(
    stopped: str, counts: dict[str, int], success: bool, trip: bool
) -> None:
    """The last success moves only for an answered read in a pass the breaker did not stop; the
    breaker's sets the trip time."""
    metrics = Metrics()
    metrics.last_success.set(1.0)
    metrics.on_pass(PassResult(stopped, 0, reads=3, counts=Counter(counts)), NOW)  # type: ignore[arg-type]
    assert _value(metrics, SUCCESS) == (NOW.timestamp() if success else 1.0)
    assert _value(metrics, "lta_worker_breaker_last_trip_timestamp_seconds") == (
        NOW.timestamp() if trip else 0.0
    )


class StoreFigures:
    """The few store queries `Metrics.on_store` reads, with fixed answers."""

    def count_by_state(self) -> dict[str, int]:
        return {"active": 4, "dropping": 2}

    def count_due(self, now: datetime) -> int:
        return 1

    def outbox_counts(self) -> OutboxCounts:
        return OutboxCounts(backlog=3, dead=1)


def test_metrics_carry_the_outbox_and_pending_drops_from_the_store() -> None:
    """After a pass the gauges say what the database holds (states, due, drops, outbox)."""
    metrics = Metrics()
    metrics.on_store(StoreFigures(), NOW)  # type: ignore[arg-type]
    value = metrics.registry.get_sample_value
    assert value("lta_worker_users", {"state": "dropping"}) == 2
    assert value("lta_worker_users_due") == 1
    assert value("lta_worker_pending_drops") == 2
    assert value("lta_worker_webhook_backlog") == 3
    assert value("lta_worker_webhook_dead_letters") == 1


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
