"""Health in an outage, end to end: the real worker's passes with every read failing, and the
verdict `status --check` and `/healthz` give (`collect_status`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from lta_worker.report import collect_status

from .conftest import Harness

pytestmark = pytest.mark.anyio

INTERVAL = timedelta(minutes=10)
TICK = timedelta(seconds=30)  # how often `serve` would start a pass


def verdict(harness: Harness) -> dict[str, Any]:
    return collect_status(harness.settings(), harness.clock.now())


async def test_an_outage_turns_health_unhealthy_within_the_interval_and_back(
    harness: Harness,
) -> None:
    """Down: unhealthy within `poll.interval`, through empty passes; healthy once reads return."""
    harness.configure("poll", interval="10m")
    for n in range(6):
        await harness.enroll(f"user-{n}")
    await harness.run_pass()
    assert verdict(harness)["healthy"] is True

    harness.advance(INTERVAL / 2)
    harness.sim.inject_fault("drop", rate=1.0)  # the service is gone: every read fails
    down_at = harness.clock.now()
    unhealthy_at = None
    empty_passes_after = 0
    while harness.clock.now() - down_at < 3 * INTERVAL:
        harness.advance(TICK)
        result = await harness.run_pass()
        assert result.counts["ok"] == 0
        data = verdict(harness)
        if unhealthy_at is None and not data["healthy"]:
            unhealthy_at = harness.clock.now()
        elif unhealthy_at is not None:
            assert data["healthy"] is False, data["problems"]  # and it stays so
            empty_passes_after += result.reads == 0
    assert unhealthy_at is not None, "healthy through the whole outage"
    assert unhealthy_at - down_at <= INTERVAL + TICK
    assert empty_passes_after > 0  # passes with nobody due did not make it healthy
    problems = verdict(harness)["problems"]
    assert any("failed" in p for p in problems), problems

    harness.sim.clear_faults()
    back_at = harness.clock.now()
    while not verdict(harness)["healthy"]:
        assert harness.clock.now() - back_at <= INTERVAL + TICK, verdict(harness)["problems"]
        harness.advance(TICK)
        await harness.run_pass()
    assert verdict(harness)["last_success"]["counts"]["ok"] > 0
