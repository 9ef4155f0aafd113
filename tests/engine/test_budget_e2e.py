"""Pacing end to end, and the adaptive plan following the budget the service reports as soon
as it reports it (a new install's first pass, a quota raised, lowered or swinging mid-pass): the
real Worker and the simulator on one virtual clock (trio's MockClock), so windows of seconds or
of an hour pass without waiting for them."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import anyio
import pytest

from lta_worker.domain import BudgetSeen, SchedulePlan
from lta_worker.report import PlanCache, collect_status
from lta_worker.simulator import DEMO_CLIENT_ID
from lta_worker.worker import REPLAN_GAP, PassResult
from support.virtual_time import autojump

from .conftest import Harness

pytestmark = pytest.mark.anyio

RESERVE = 0.1  # ratelimit.reserve's default: 10% of the limit is left for other traffic
USERS = 120  # the adaptive install of the plan tests
INTERVAL = timedelta(hours=1)
# Users whose read may still be decided under the plan in force before the budget moved:
# the turns in flight (`poll.concurrency` = 4) and the reads until the next check of it.
LAG = 8


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("fmt", "users", "window"),
    [("draft", 5, 3), ("combined", 5, 3), ("triple", 5, 3), ("x", 5, 3), ("draft", 6, 3600)],
)
async def test_every_due_user_is_read_over_several_windows_without_a_429(
    virtual_harness: Harness, fmt: str, users: int, window: int
) -> None:
    """More due reads than one window of 6 allows (3 s, or an hour on virtual time): all are
    made, paced over the windows, none over the budget less the reserve, no 429."""
    h = virtual_harness
    h.configure("poll", max_pass_duration="4h")  # three hour-long windows in one pass
    h.sim.configure(budget=6, window=window, header_format=fmt)
    usable = int(6 * (1 - RESERVE))
    started = h.clock.now()
    async with autojump():
        for n in range(users):
            await h.enroll(f"user-{n}")
        h.sim.clear_requests()
        result = await h.run_pass()
    assert (result.exit_code, result.throttled) == (0, 0)
    reads = h.reads()
    assert len(reads) == 2 * users
    assert all(e.status == 200 for e in reads)
    per_window = Counter(int(e.at.timestamp() // window) for e in reads)  # the server's windows
    assert max(per_window.values()) <= usable
    windows = -(-2 * users // usable)
    assert len(per_window) >= windows
    assert h.clock.now() - started >= timedelta(seconds=window * (windows - 1))


@pytest.mark.timeout(60)
async def test_each_result_is_stamped_with_its_own_read(virtual_harness: Harness) -> None:
    """Each stored result (and `result.changed`) carries its own read's time, not the turn's end."""
    h = virtual_harness
    h.sim.configure(budget=4, window=60)
    h.configure("poll", stats="always")
    async with autojump():
        await h.enroll("alice")
        h.sim.clear_requests()
        await h.run_pass()
    sent = {e.path.rsplit("/", 1)[-1]: e.at for e in h.reads("alice")}
    assert sent["stats"] - sent["latest-change"] >= timedelta(seconds=10)
    with h.store() as store:
        stored = {row.endpoint: row.fetched_at for row in store.export_results("alice")}
    assert stored == sent


@pytest.mark.timeout(60)
async def test_a_user_read_counts_in_users_when_the_pass_is_aborted(
    virtual_harness: Harness,
) -> None:
    """A user whose first read was made counts in `users` when the pass is aborted mid-turn."""
    h = virtual_harness
    h.sim.configure(budget=4, window=60)
    h.configure("poll", stats="always")
    async with autojump():
        await h.enroll("alice")
        worker = h.worker()
        async with worker, anyio.create_task_group() as tg:
            box: dict[str, PassResult] = {}

            async def run() -> None:
                box["result"] = await worker.run_pass()

            tg.start_soon(run)
            await anyio.sleep(5)  # alice's first read is back; the next waits ~20 s
            assert worker.current is not None
            worker.current.stop.abort("config")
    assert (box["result"].reads, box["result"].users) == (1, 1)


@pytest.mark.timeout(60)
async def test_a_quota_of_0_for_a_while_then_a_normal_one(virtual_harness: Harness) -> None:
    """q=0 for a while: `status` works (unhealthy, naming it), reads resume after (issue 37.2)."""
    h = virtual_harness
    h.configure("poll", schedule="adaptive", max_pass_duration="5m")
    h.sim.configure(budget=1000, window=60, header_format="draft")
    async with autojump():
        for n in range(12):
            await h.enroll(f"user-{n}")
        box: dict[str, PassResult] = {}

        async def run() -> None:
            box["result"] = await h.run_pass()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await anyio.sleep(0.5)  # a few reads answered, then the quota drops to 0
            h.sim.configure(budget=0)
        zero = collect_status(h.settings(), h.clock.now())
        again = await h.run_pass()
        h.sim.configure(budget=1000)
        h.sim.clear_requests()
        resumed = await h.run_pass()
        after = collect_status(h.settings(), h.clock.now())
    assert (box["result"].exit_code, again.exit_code) == (75, 75) and again.throttled > 0
    assert zero["budget"]["limit"] == 0 and not zero["healthy"]
    assert any("a limit of 0" in problem for problem in zero["problems"]), zero["problems"]
    assert resumed.exit_code == 0 and h.reads() and all(e.status == 200 for e in h.reads())
    assert after["budget"]["limit"] == 1000 and after["healthy"], after["problems"]


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
    """A quota raised mid-pass is followed at once by the pacer, `status` and the plan: the
    rest is read within minutes, and users read after it are due again at `interval`."""
    h = virtual_harness
    async with autojump():
        await _install(h, 100, seen=100)
        started = h.clock.now()
        h.sim.clear_requests()
        raised = await _pass_with(h, timedelta(minutes=10), budget=10_000)
        budget = collect_status(h.settings(), h.clock.now())["budget"]
    reads = h.reads()
    assert all(e.status == 200 for e in reads)
    assert max(e.at for e in reads) - raised < timedelta(minutes=2), (len(reads), raised)
    reset_in = datetime.fromisoformat(budget["reset_at"]) - h.clock.now()
    assert (budget["limit"], budget["window_seconds"]) == (10_000, 3600)
    assert reset_in <= timedelta(seconds=3601), budget
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
