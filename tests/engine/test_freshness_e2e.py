"""The freshness schedule end to end: the real worker through the simulator."""

from __future__ import annotations

from datetime import timedelta

import pytest

from .conftest import Harness

pytestmark = pytest.mark.anyio

HOUR = timedelta(hours=1)
TICK = HOUR + timedelta(seconds=1)


def _endpoints(harness: Harness, since: int) -> list[str]:
    return [e.path.rsplit("/", 1)[-1] for e in harness.reads()[since:]]


async def test_stats_is_skipped_while_latest_change_stands_still_and_read_at_max_age(
    harness: Harness,
) -> None:
    """`stats = "on_change"`: stats read first, when latest-change moves, and at stats_max_age."""
    harness.configure("poll", stats="on_change", stats_max_age="3h")
    await harness.enroll("u1")
    harness.sim.set_payload("u1", "latest-change", {"changed_at": "2025-01-01T00:00:00Z"})
    seen = len(harness.reads())
    await harness.run_pass()
    assert _endpoints(harness, seen) == ["latest-change", "stats"]
    for _ in range(2):  # 1 h and 2 h later: nothing moved, stats is young
        harness.advance(TICK)
        seen = len(harness.reads())
        await harness.run_pass()
        assert _endpoints(harness, seen) == ["latest-change"]
    harness.advance(TICK)  # 3 h: stats is stats_max_age old
    seen = len(harness.reads())
    await harness.run_pass()
    assert _endpoints(harness, seen) == ["latest-change", "stats"]
    harness.advance(TICK)
    harness.sim.set_payload("u1", "latest-change", {"changed_at": "2025-01-02T00:00:00Z"})
    seen = len(harness.reads())
    await harness.run_pass()
    assert _endpoints(harness, seen) == ["latest-change", "stats"]
    with harness.store() as store:
        rows = {r.endpoint: r for r in store.export_results(user="u1")}
    assert rows["latest-change"].payload == {"changed_at": "2025-01-02T00:00:00Z"}


async def test_the_adaptive_schedule_reads_a_user_that_changes_sooner_than_an_idle_one(
    harness: Harness,
) -> None:
    """Adaptive: a changing user is due sooner than an idle one, none beyond max_interval."""
    harness.configure(
        "poll", schedule="adaptive", interval="10m", max_interval="12h", stats="on_change"
    )
    harness.configure("ratelimit", fallback_per_hour=2.0)
    harness.sim.configure(budget=1_000_000, window=3600, header_format="none")
    await harness.enroll("busy")
    await harness.enroll("idle")
    harness.sim.set_payload("idle", "latest-change", {"changed_at": "2025-01-01T00:00:00Z"})
    for n in range(12):
        harness.sim.set_payload("busy", "latest-change", {"changed_at": f"2025-01-01T{n:02}:00Z"})
        await harness.run_pass(max_duration=timedelta(seconds=30))
        harness.advance(timedelta(hours=2))
    busy, idle = harness.user("busy"), harness.user("idle")
    assert busy.estimate is not None and idle.estimate is not None
    assert busy.estimate.per_day() > idle.estimate.per_day()
    busy_gap = busy.next_due_at - busy.last_polled_at
    idle_gap = idle.next_due_at - idle.last_polled_at
    assert busy_gap < idle_gap <= timedelta(hours=12)
