"""Health in an outage, end to end (under the adaptive schedule on virtual time): the real
worker's passes with every read failing, and the verdict `status --check` and `/healthz` give."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest

from lta_worker.report import collect_status
from support.virtual_time import autojump

from .conftest import Harness

pytestmark = pytest.mark.anyio

INTERVAL = timedelta(minutes=10)
TICK = timedelta(seconds=30)  # how often `serve` would start a pass
SERVE_TICK = timedelta(minutes=1)  # `poll.tick` of the adaptive test


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


async def _serve(h: Harness, tick: timedelta = SERVE_TICK) -> None:
    """Passes every `tick`, as `serve` starts them, until cancelled."""
    while True:
        await h.run_pass()
        await anyio.sleep(tick.total_seconds())


async def _until_unhealthy(h: Harness, limit: timedelta) -> timedelta:
    """How long until the verdict says unhealthy (checked every 10 s, passes running)."""
    start = h.clock.now()
    while h.clock.now() - start < limit:
        if not collect_status(h.settings(), h.clock.now())["healthy"]:
            break
        await anyio.sleep(10)
    return h.clock.now() - start


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("users", "busy", "budget", "max_interval"),
    [(3, 0, 1_000_000, "24h"), (6, 2, 24, "24h")],  # a generous budget; a tight one
)
async def test_an_outage_under_the_adaptive_schedule_shows_within_the_documented_bound(
    virtual_harness: Harness, users: int, busy: int, budget: int, max_interval: str
) -> None:
    """An outage shows within 2 x interval + tick + 1 s (docs/operations.md, "How soon...")."""
    h = virtual_harness
    h.configure("poll", schedule="adaptive", interval="10m", max_interval=max_interval)
    h.configure("poll", stats="on_change", tick="1m")
    h.sim.configure(budget=budget, window=3600, header_format="draft")
    async with autojump():
        for n in range(users):
            await h.enroll(f"user-{n}")
            h.sim.set_payload(f"user-{n}", "latest-change", {"changed_at": "2025-01-01T00:00Z"})
        for step in range(6 * 60 // 7):  # 6 h: only the busy users change
            for n in range(busy):
                h.sim.set_payload(f"user-{n}", "latest-change", {"changed_at": f"{step}"})
            await h.run_pass()
            await anyio.sleep(7 * 60)
        before = collect_status(h.settings(), h.clock.now())
        assert before["healthy"] is True, before["problems"]
        if busy:  # a user that changes is read sooner than an idle one, none past max_interval
            rows = [h.user(f"user-{n}") for n in (0, users - 1)]
            gaps = [r.next_due_at - r.last_polled_at for r in rows]
            assert rows[0].estimate.per_day() > rows[1].estimate.per_day()
            assert gaps[0] < gaps[1] <= timedelta(hours=24), gaps
        h.sim.inject_fault("503", rate=1.0)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_serve, h)
            took = await _until_unhealthy(h, timedelta(hours=30))
            tasks.cancel_scope.cancel()
    bound = 2 * INTERVAL + SERVE_TICK + timedelta(seconds=1)
    assert took <= bound, f"unhealthy {took} after the outage"
