"""`poll.stats = "on_change"` end to end: the real worker through the simulator (a changing
user read sooner than an idle one under the adaptive schedule: test_health_e2e.py)."""

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
