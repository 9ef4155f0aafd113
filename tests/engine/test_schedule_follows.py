"""The schedule follows the settings in force (issue 11, case 5); `poll.stats = "on_change"`
end to end (a changing user read sooner than an idle one under the adaptive schedule:
test_health_e2e.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from structlog.testing import capture_logs

from lta_worker.domain import UserUpdate

from .conftest import ON_BOTH_BACKENDS, Harness

if TYPE_CHECKING:
    from lta_worker.worker import PassEngine

pytestmark = pytest.mark.anyio

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
TICK = HOUR + timedelta(seconds=1)


async def test_a_lower_interval_applies_at_the_next_run(harness: Harness) -> None:
    """Read under 1h, then `poll.interval` becomes 30m: due 30m after the read, not 1h."""
    await harness.enroll("u")
    await harness.run_pass()
    read_at = harness.user("u").last_polled_at
    harness.advance(31 * MINUTE)
    harness.configure("poll", interval="30m")
    with capture_logs() as logs:
        result = await harness.run_pass()
    assert result.reads == 2
    assert any(e["event"] == "schedule.followed" for e in logs)
    assert harness.user("u").last_polled_at > read_at


async def test_a_higher_interval_moves_users_later_without_a_burst(harness: Harness) -> None:
    """Read under 1h, then 2h: nobody is read at 1h; each is due 2h after its own read."""
    await harness.enroll("a")
    await harness.run_pass()
    harness.advance(10 * MINUTE)
    await harness.enroll("b")
    await harness.run_pass()
    reads = {u: harness.user(u).last_polled_at for u in ("a", "b")}
    harness.configure("poll", interval="2h")
    harness.advance(61 * MINUTE)
    assert (await harness.run_pass()).reads == 0
    for u in ("a", "b"):
        assert harness.user(u).next_due_at == reads[u] + timedelta(hours=2)


async def test_a_lower_parked_interval_applies_to_parked_users(harness: Harness) -> None:
    """A parked user re-checked every 24h is re-checked after 1h once the setting says 1h."""
    await harness.enroll("p", last_sync_age_days=100)
    await harness.run_pass()
    assert harness.user("p").state == "parked"
    harness.configure("poll", parked_interval="1h")
    harness.advance(61 * MINUTE)
    assert (await harness.run_pass()).reads >= 1


async def test_a_backoff_is_capped_by_the_interval_in_force(harness: Harness) -> None:
    """A backed-off user is never due later than its read + the (new, lower) interval."""
    await harness.enroll("t")
    await harness.run_pass()
    row = harness.user("t")
    read_at = row.last_polled_at
    backed_off = UserUpdate(  # a long backoff under the old 1h interval
        user_id=row.id,
        state="active",
        next_due_at=read_at + 50 * MINUTE,
        consecutive_failures=4,
        last_outcome="transient",
        last_polled_at=read_at,
        due_class="backoff",
    )
    with harness.store() as store:
        store.apply([backed_off])
    harness.configure("poll", interval="20m")
    harness.advance(21 * MINUTE)
    assert (await harness.run_pass()).reads == 2


@ON_BOTH_BACKENDS
async def test_a_reload_re_plans_what_a_pass_scheduled_under_the_old_interval(
    harness: Harness,
) -> None:
    """A reload mid-pass beside another instance: every user ends due 30m after its read."""
    users = ["a", "b", "c", "d"]
    for user in users:
        await harness.enroll(user)
    harness.configure("poll", concurrency=1, batch_size=1)  # one turn after the other
    async with harness.worker() as worker:
        harness.configure("poll", interval="30m")
        done: list[int] = []

        def meanwhile(engine: PassEngine) -> None:
            done.append(engine.result.users)
            if len(done) == 1:  # another instance, already reloaded, applies 30m
                with harness.store() as other:
                    other.follow_schedule(30 * MINUTE, timedelta(hours=24), harness.clock.now())
            if len(done) == 3:  # this one is reloaded now, its pass still running
                worker.reload(harness.settings())

        result = await worker.run_pass(on_progress=meanwhile)
        assert result.reads == 2 * len(users)
        last = harness.user("d")  # read after the reload, by the same pass
        assert last.next_due_at - last.last_polled_at == 30 * MINUTE
        harness.advance(MINUTE)
        assert (await worker.run_pass()).reads == 0
    for user in users:
        row = harness.user(user)
        assert row.next_due_at - row.last_polled_at == 30 * MINUTE, user


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
