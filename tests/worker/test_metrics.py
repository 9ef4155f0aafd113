"""The worker's metrics registry: figures set from what the pass and its plan report."""

from __future__ import annotations

import math

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lta_worker.domain import SchedulePlan
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
