"""The adaptive plan follows the budget the service reports as soon as it reports it: a new
install's first pass, a quota raised or lowered mid-pass (virtual time)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import anyio
import pytest

from lta_worker.domain import BudgetSeen, SchedulePlan
from lta_worker.report import PlanCache
from lta_worker.simulator import DEMO_CLIENT_ID
from lta_worker.worker import REPLAN_GAP
from support.virtual_time import autojump

from .conftest import Harness

pytestmark = pytest.mark.anyio

USERS = 120
INTERVAL = timedelta(hours=1)
# Users whose read may still be decided under the plan in force before the budget moved:
# the turns in flight (`poll.concurrency` = 4) and the reads until the next check of it.
LAG = 8


async def _install(h: Harness, budget: int, *, seen: int | None = None) -> None:
    """`USERS` users, adaptive, `budget` reads an hour at the sim (stored as seen, if `seen`)."""
    h.configure("poll", schedule="adaptive", stats="on_change", interval="1h")
    h.configure("poll", max_interval="24h", max_pass_duration="3h")
    h.sim.configure(budget=budget, window=3600, header_format="draft")
    for n in range(USERS):
        await h.enroll(f"user-{n:03}")
    if seen is not None:
        with h.store() as store:
            store.record_budget(
                DEMO_CLIENT_ID,
                BudgetSeen(seen, seen, h.clock.now() + INTERVAL, 3600.0, h.clock.now()),
            )


def _spacing(h: Harness, since: datetime) -> list[tuple[datetime, timedelta]]:
    """(read at, due again after) of the users read ok since `since` and due later, by time."""
    with h.store() as store:
        spaced = [
            (row.last_polled_at, row.next_due_at - row.last_polled_at)
            for row in store.list_users()
            if row.last_outcome == "ok"
            and row.last_polled_at is not None
            and row.next_due_at is not None
            and row.next_due_at > row.last_polled_at >= since
        ]
    return sorted(spaced)


async def _pass_with(h: Harness, after: timedelta, **budget: int) -> datetime:
    """One pass; `after` into it the simulator's budget changes to `budget`. When it changed."""
    box: dict[str, datetime] = {}

    async def change() -> None:
        await anyio.sleep(after.total_seconds())
        h.sim.configure(**budget)
        box["at"] = h.clock.now()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(change)
        await h.run_pass()
    return box["at"]


@pytest.mark.timeout(120)
async def test_a_new_installs_first_pass_spaces_its_users_by_the_budget_reported(
    virtual_harness: Harness,
) -> None:
    """A new install's first pass spaces users by the budget reported, not the fallback."""
    h = virtual_harness
    async with autojump():
        await _install(h, 1200)
        started = h.clock.now()
        await h.run_pass()
    spaced = _spacing(h, started)
    assert len(spaced) == USERS
    late = [gap for _, gap in spaced[LAG:] if gap != INTERVAL]
    assert not late, f"{len(late)} users spaced for the fallback, up to {max(late)}"


@pytest.mark.timeout(120)
async def test_a_quota_raised_mid_pass_is_followed_by_the_users_read_after_it(
    virtual_harness: Harness,
) -> None:
    """A quota raised mid-pass: users read after it are due again at `interval`."""
    h = virtual_harness
    async with autojump():
        await _install(h, 100, seen=100)
        started = h.clock.now()
        raised = await _pass_with(h, timedelta(minutes=10), budget=10_000)
    before = [gap for at, gap in _spacing(h, started) if at < raised]
    after = [gap for at, gap in _spacing(h, raised)]
    assert before and all(gap > INTERVAL for gap in before)  # the small budget's plan
    late = [gap for gap in after[LAG:] if gap != INTERVAL]
    assert len(after) > USERS / 2 and not late, f"{len(late)} of {len(after)} kept the old plan"


@pytest.mark.timeout(120)
async def test_a_quota_lowered_mid_pass_below_what_was_spent_is_followed_after_the_429s(
    virtual_harness: Harness,
) -> None:
    """A quota lowered below what was spent: users read after it are spaced past 2 x interval."""
    h = virtual_harness
    async with autojump():
        await _install(h, 1200, seen=1200)
        started = h.clock.now()
        lowered = await _pass_with(h, timedelta(minutes=3), budget=40)
    before = [gap for at, gap in _spacing(h, started) if at < lowered]
    after = [gap for at, gap in _spacing(h, lowered)]
    assert before and all(gap == INTERVAL for gap in before)  # the large budget's plan
    narrow = [gap for gap in after[LAG:] if gap <= 2 * INTERVAL]
    assert len(after) > 2 * LAG and not narrow, f"{len(narrow)} of {len(after)} kept the old plan"


@pytest.mark.timeout(120)
async def test_a_budget_that_keeps_swinging_is_planned_for_at_most_once_a_gap(
    virtual_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quota swinging every 5 s makes the pass re-plan at most once per `REPLAN_GAP`."""
    h = virtual_harness
    made: list[datetime] = []
    get = PlanCache.get

    def counted(self: PlanCache, *args: Any) -> SchedulePlan:
        before = self.made_at
        plan = get(self, *args)
        if self.made_at != before and self.made_at is not None:
            made.append(self.made_at)
        return plan

    monkeypatch.setattr(PlanCache, "get", counted)

    async def swing() -> None:
        for n in range(60):
            await anyio.sleep(5)
            h.sim.configure(budget=10_000 if n % 2 == 0 else 100)

    async with autojump():
        await _install(h, 100, seen=100)
        started = h.clock.now()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(swing)
            await h.run_pass()
    swinging = [at for at in made if started < at <= started + timedelta(minutes=5)]
    assert 1 <= len(swinging) <= 1 + timedelta(minutes=5) / REPLAN_GAP
