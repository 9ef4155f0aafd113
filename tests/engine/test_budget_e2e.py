"""Pacing end to end: the real Worker and the simulator on one virtual clock (trio's
MockClock), so windows of seconds or of an hour pass without waiting for them."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import anyio
import pytest

from lta_worker.report import collect_status
from lta_worker.simulator import DEMO_CLIENT_ID
from lta_worker.worker import PassResult
from support.virtual_time import autojump

from .conftest import Harness

pytestmark = pytest.mark.anyio

RESERVE = 0.1  # ratelimit.reserve's default: 10% of the limit is left for other traffic


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
@pytest.mark.parametrize(
    ("raised", "window"), [(100_000, 3600), (1200, 600)], ids=["same-window", "shorter-window"]
)
async def test_a_quota_raised_within_the_window_is_followed_at_once(
    virtual_harness: Harness, raised: int, window: int
) -> None:
    """A quota raised mid-window is followed at once and shown by `status` (issues 26.2, 37.8)."""
    h = virtual_harness
    h.sim.configure(budget=100, window=3600, header_format="draft")
    async with autojump():
        for n in range(30):
            await h.enroll(f"user-{n}")
        h.sim.clear_requests()
        assert h.sim.budget_of(DEMO_CLIENT_ID).reset > 3500  # the window has just begun
        started = h.clock.now()
        box: dict[str, PassResult] = {}

        async def run() -> None:
            box["result"] = await h.run_pass()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await anyio.sleep(200)
            before = len(h.reads())
            h.sim.configure(budget=raised, window=window)
            raised_at = h.clock.now()
        budget = collect_status(h.settings(), h.clock.now())["budget"]
    result = box["result"]
    assert (result.exit_code, result.throttled) == (0, 0)
    reads = h.reads()
    assert len(reads) == 60 and all(e.status == 200 for e in reads)
    assert before < 30  # the small budget was being spread when the quota was raised
    assert max(e.at for e in reads) - raised_at < timedelta(minutes=2), (started, raised_at)
    assert (budget["limit"], budget["window_seconds"]) == (raised, window)
    reset_in = datetime.fromisoformat(budget["reset_at"]) - datetime.fromisoformat(
        budget["observed_at"]
    )
    assert reset_in <= timedelta(seconds=window + 1), budget


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
