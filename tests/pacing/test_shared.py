"""The shared budget: its rules row by row and against a model server with several instances,
its shell on a fake store, and the row transaction on SQLite and PostgreSQL."""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass, field
from dataclasses import replace as replace_seen
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lta_worker.domain import BudgetSeen
from lta_worker.pacing import RateLimitInfo, SharedBudget
from lta_worker.pacing._shared import (
    BLIND_POLL,
    Grant,
    Settlement,
    Tag,
    grant,
    observation,
    settle,
    transact,
)
from lta_worker.storage import Store
from support.storage import FakeStore

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
PROBE = timedelta(seconds=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def seen(remaining: int | None, reset_in: float | None, *, limit: int | None = 100) -> BudgetSeen:
    """An observation made at T0: `remaining` left, reset `reset_in` seconds later."""
    return BudgetSeen(
        limit=limit,
        remaining=remaining,
        reset_at=None if reset_in is None else at(reset_in),
        window_seconds=60.0,
        observed_at=T0,
    )


def take(row: BudgetSeen | None, reserved: int, now: float, want: int) -> Any:
    return grant(row, reserved, now=at(now), want=want, reserve=0.1, probe_timeout=PROBE)


def back(
    row: BudgetSeen | None, reserved: int, settlement: Settlement, now: float = 1.0
) -> tuple[BudgetSeen | None, int]:
    return settle(row, reserved, settlement, now=at(now), reserve=0.1)


# -- the rules, row by row ------------------------------------------------------------------


def test_with_no_row_permits_are_not_counted() -> None:
    """Before any figure was reported, permits go uncounted (each pacer's own pacing applies)."""
    row, reserved, got = take(None, 0, 0, 3)
    assert (row, reserved, got) == (None, 0, Grant(3, "uncounted"))


def test_a_known_window_grants_what_remains_less_the_reserve_and_the_reserved() -> None:
    """floor(remaining - reserve * limit) - reserved permits go, no more."""
    row, reserved, got = take(seen(50, 60), 0, 1, 100)
    assert (got.granted, got.tag, reserved) == (40, at(60), 40)
    _, reserved, more = take(row, reserved, 2, 5)
    assert (more.granted, reserved) == (0, 40)
    assert more.wait == pytest.approx(59.0)  # until the reset and its margin


def test_no_permit_goes_in_the_last_second_before_the_reset() -> None:
    """A permit granted a second or less before the reset could land in the next window."""
    _, _, early = take(seen(50, 60), 0, 58.9, 1)
    assert early.granted == 1
    _, reserved, late = take(seen(50, 60), 0, 59.1, 1)
    assert (late.granted, reserved) == (0, 0)
    assert late.wait == pytest.approx(1.9)


def test_an_answer_lowers_remaining_and_settles_its_permit() -> None:
    """Same window: the lower remaining wins and the answered permit leaves `reserved`."""
    obs = replace_seen(seen(45, 59.5), observed_at=at(1))
    row, reserved = back(seen(50, 60), 3, Settlement(at(60), True, obs))
    assert row is not None
    assert (row.remaining, row.reset_at, reserved) == (45, at(59.5), 2)
    # An older, higher figure of the same window does not raise it again.
    row, reserved = back(row, reserved, Settlement(at(60), True, seen(48, 60)))
    assert row is not None
    assert (row.remaining, row.reset_at, row.observed_at, reserved) == (45, at(59.5), at(1), 1)


@pytest.mark.parametrize(
    ("before", "after", "granted"),
    [
        ((5000, 4999), (50000, 49998), 44998),  # raised within the window
        ((5000, 10), (50000, 49990), 44990),  # raised after the old one was spent
        ((50000, 49999), (5000, 4998), 4498),  # lowered within the window
    ],
)
def test_a_changed_limit_is_followed_at_once(
    before: tuple[int, int], after: tuple[int, int], granted: int
) -> None:
    """A quota raised or lowered within a window: the grant follows the new figures at once."""
    limit, remaining = before
    row = seen(remaining, 3600, limit=limit)
    limit, remaining = after
    obs = replace_seen(seen(remaining, 3600, limit=limit), observed_at=at(10))
    row2, reserved = back(row, 1, Settlement(at(3600), True, obs), now=10)
    assert row2 is not None and (row2.limit, row2.remaining) == (limit, remaining)
    _, _, got = take(row2, reserved, 10, 10**6)
    assert got.granted == granted


def test_a_late_answer_does_not_bring_back_an_old_limit() -> None:
    """An answer sent before the figure in the row cannot restore the limit it reported."""
    row = replace_seen(seen(400, 3600, limit=500), observed_at=at(9))
    late = replace_seen(seen(4990, 3600, limit=5000), observed_at=at(5))
    row2, _ = back(row, 0, Settlement(at(3600), True, late), now=11)
    assert row2 is not None and (row2.limit, row2.remaining) == (500, 400)


def test_an_answer_without_figures_keeps_its_permit_reserved() -> None:
    """A failed request may have been counted: its permit stays reserved until the reset."""
    row, reserved = back(seen(50, 60), 3, Settlement(at(60), True, None))
    assert (row, reserved) == (seen(50, 60), 3)


def test_unused_permits_come_back() -> None:
    """A permit given back unused leaves `reserved`; one of another window does not."""
    _, reserved = back(seen(50, 60), 3, Settlement(at(60), used=False))
    assert reserved == 2
    _, reserved = back(seen(50, 60), 3, Settlement(at(0), used=False))
    assert reserved == 3
    _, reserved = back(seen(50, 60), 3, Settlement("uncounted", used=False))
    assert reserved == 3


def test_a_new_window_starts_from_its_figures() -> None:
    """A reset beyond the tolerance opens a new window: its figures, nothing reserved."""
    row, reserved = back(seen(5, 60), 7, Settlement(at(60), True, seen(99, 120, limit=None)))
    assert row is not None
    assert (row.remaining, row.reset_at, row.limit, reserved) == (99, at(120), 100, 0)


def test_a_late_answer_from_a_past_window_changes_nothing() -> None:
    """Figures of a window already over (sent before the row's) are ignored, tag and all."""
    late = replace_seen(seen(3, 60), observed_at=at(-5))
    row, reserved = back(seen(80, 120), 4, Settlement(at(60), True, late))
    assert (row, reserved) == (seen(80, 120), 4)


def test_an_earlier_reset_sent_later_opens_its_window() -> None:
    """An earlier reset (a shorter window), sent after the row's figures, opens its window."""
    raised = BudgetSeen(1200, 1196, at(300), 600.0, at(10))
    row, reserved = back(seen(50, 3240), 4, Settlement(at(3240), True, raised))
    assert (row, reserved) == (raised, 0)


def test_after_the_reset_one_probe_at_a_time_until_figures_open_the_window() -> None:
    """Past the reset the row is blind: one probe, the others wait, its answer opens the window."""
    row, reserved, probe = take(seen(0, 60), 9, 61.5, 3)
    assert probe == Grant(1, "blind")
    assert row is not None
    assert (row.remaining, row.reset_at, reserved) == (None, at(61.5) + PROBE, 1)
    row, reserved, other = take(row, reserved, 61.6, 3)
    assert other == Grant(0, "blind", BLIND_POLL)
    fresh = replace_seen(seen(99, 120), observed_at=at(61.5))
    row, reserved = back(row, reserved, Settlement("blind", True, fresh))
    assert (row, reserved) == (fresh, 0)
    _, reserved, opened = take(row, reserved, 61.7, 3)
    assert (opened.granted, opened.tag, reserved) == (3, at(120), 3)


def test_a_probe_without_figures_lets_the_next_one_go_while_few_failed() -> None:
    """A failed probe stays counted; the next goes at once until a window's worth failed."""
    row: BudgetSeen | None = replace_seen(seen(0, 60, limit=3), window_seconds=10.0)
    row, reserved, _ = take(row, 0, 62, 1)
    row, reserved = back(row, reserved, Settlement("blind", True, None), now=62.1)
    assert reserved == 1
    row, reserved, second = take(row, reserved, 62.2, 1)
    assert second == Grant(1, "blind")
    row, reserved = back(row, reserved, Settlement("blind", True, None), now=62.3)
    assert reserved == 2  # floor(3 * 0.9) = 2 may fail in a row
    _, _, held = take(row, reserved, 72.2, 1)
    assert held.granted == 0
    _, reserved, after_window = take(row, reserved, 72.3, 1)
    assert (after_window, reserved) == (Grant(1, "blind"), 1)


def test_a_lost_probe_is_given_up_after_its_deadline() -> None:
    """A probe whose instance died never settles; another goes after `probe_timeout`."""
    row, reserved, _ = take(seen(0, 60), 0, 62, 1)
    _, _, waiting = take(row, reserved, 62 + PROBE.total_seconds() - 1, 1)
    assert waiting.granted == 0
    _, _, next_probe = take(row, reserved, 62 + PROBE.total_seconds(), 1)
    assert next_probe == Grant(1, "blind")


def test_transact_settles_before_it_grants() -> None:
    """Permits given back in the same transaction are available to the grant."""
    backs = [Settlement(at(60), used=False)] * 2
    _, reserved, got = transact(
        seen(12, 60), 2, backs, now=at(1), want=5, reserve=0.1, probe_timeout=PROBE
    )
    assert (got.granted, reserved) == (2, 2)


@pytest.mark.parametrize(
    ("info", "status", "expected"),
    [
        (None, 200, None),
        (RateLimitInfo(limit=10, remaining=None, reset_after=5.0), 200, None),
        (RateLimitInfo(limit=10, remaining=4, reset_after=5.0, window=60.0), 200, (4, 5.0)),
        (RateLimitInfo(retry_after=7.0), 429, (0, 7.0)),
        (None, 429, (0, 60.0)),
    ],
)
def test_observation_of_an_answer(
    info: RateLimitInfo | None, status: int, expected: tuple[int, float] | None
) -> None:
    """Figures become an observation counted from the send; a 429 spends the window."""
    obs = observation(info, status, T0)
    got = None if obs is None else (obs.remaining, obs.reset_at, obs.observed_at)
    assert got == (None if expected is None else (expected[0], at(expected[1]), T0))


# -- several instances against a model server ---------------------------------------------


@dataclass
class Instance:
    """One instance's block of permits in the model."""

    tag: Tag = "uncounted"
    held: int = 0


@dataclass
class Model:
    """A server with fixed windows from t=0 counting every request the moment it is sent."""

    limit: int
    window: int
    counts: Counter[int] = field(default_factory=Counter)
    refused: int = 0
    # (time, new limit): the service changes the quota then, within a window or at its start.
    changes: tuple[tuple[float, int], ...] = ()

    def limit_at(self, t: float) -> int:
        """The limit in force at `t`."""
        limit = self.limit
        for at, new in sorted(self.changes):
            limit = new if at <= t else limit
        return limit

    def request(self, t: float) -> tuple[int, RateLimitInfo]:
        index = math.floor(t / self.window)
        reset = max(1, math.ceil((index + 1) * self.window - t))
        limit = self.limit_at(t)
        if self.counts[index] >= limit:
            self.refused += 1
            return 429, RateLimitInfo(limit, 0, float(reset), float(self.window), float(reset))
        self.counts[index] += 1
        left = limit - self.counts[index]
        return 200, RateLimitInfo(limit, left, float(reset), float(self.window))


Step = tuple[str, int, float]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.tuples(
        st.integers(min_value=2, max_value=40),  # limit
        st.integers(min_value=3, max_value=12),  # window length
        st.integers(min_value=1, max_value=4),  # instances
        st.integers(min_value=1, max_value=4),  # block size
    ),
    start=st.floats(min_value=0.0, max_value=12.0),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["acquire", "acquire", "answer", "fail", "advance"]),
            st.integers(min_value=0, max_value=10_000),
            st.floats(min_value=0.0, max_value=2.0),
        ),
        max_size=400,
    ),
)
def test_instances_together_stay_within_every_window(
    shape: tuple[int, int, int, int], start: float, steps: list[Step]
) -> None:
    """Any interleaving of instances, answers (late, lost, failed) and time: no window over."""
    limit, window, count, block = shape
    server = Model(limit, window)
    row: BudgetSeen | None = BudgetSeen(None, None, None, None, at(start))  # nothing known
    reserved = 0
    instances = [Instance() for _ in range(count)]
    in_flight: list[tuple[Tag, float, int, RateLimitInfo]] = []
    t = start

    def apply(settlement: Settlement) -> None:
        nonlocal row, reserved
        row, reserved = settle(row, reserved, settlement, now=at(t), reserve=0.1)

    for op, pick, dt in steps:
        if op == "advance":
            t += dt
        elif op == "acquire":
            inst = instances[pick % count]
            tag = inst.tag
            if inst.held and isinstance(tag, datetime) and at(t) >= tag - timedelta(seconds=1):
                for _ in range(inst.held):
                    apply(Settlement(tag, used=False))
                inst.held = 0
            if not inst.held:
                row, reserved, got = grant(
                    row, reserved, now=at(t), want=block, reserve=0.1, probe_timeout=PROBE
                )
                inst.tag, inst.held = got.tag, got.granted
            if inst.held:
                inst.held -= 1
                status, info = server.request(t)
                in_flight.append((inst.tag, t, status, info))
        elif in_flight:
            tag, sent, status, info = in_flight.pop(pick % len(in_flight))
            obs = observation(info, status, at(sent)) if op == "answer" else None
            apply(Settlement(tag, True, obs))
    assert server.refused == 0
    allowed = math.floor(limit - 0.1 * limit + 1e-9)
    assert max(server.counts.values(), default=0) <= allowed


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    limit=st.integers(min_value=2, max_value=400),
    window=st.integers(min_value=3, max_value=60),
    changes=st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=120.0), st.integers(2, 400)), max_size=4
    ),
    gaps=st.lists(st.floats(min_value=0.0, max_value=3.0), min_size=1, max_size=300),
)
def test_one_instance_never_stalls_while_remaining_is_above_the_reserve(
    limit: int, window: int, changes: list[tuple[float, int]], gaps: list[float]
) -> None:
    """A changing limit: above the reserve a permit goes at once; no window over its highest."""
    server = Model(limit, window, changes=tuple(changes))
    row: BudgetSeen | None = None
    reserved = 0
    t = 0.0
    for gap in gaps:
        t += gap
        row, reserved, got = grant(
            row, reserved, now=at(t), want=1, reserve=0.1, probe_timeout=PROBE
        )
        if not got.granted:
            continue
        status, info = server.request(t)
        obs = observation(info, status, at(t))
        row, reserved = settle(
            row, reserved, Settlement(got.tag, True, obs), now=at(t), reserve=0.1
        )
        assert info.limit is not None and info.remaining is not None
        assert info.reset_after is not None
        spare = info.remaining - 0.1 * info.limit - reserved
        if status == 200 and spare >= 1 and info.reset_after > 1.0:
            _, _, again = grant(row, reserved, now=at(t), want=1, reserve=0.1, probe_timeout=PROBE)
            assert again.granted == 1, (t, info, row, reserved)

    for index, count in server.counts.items():  # (a lowered limit may refuse one: unseen)
        limits = [server.limit_at(index * window), *(n for a, n in changes if a // window == index)]
        assert count <= max(math.floor(n * 0.9 + 1e-9) for n in limits)


# -- the shell ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_shell_takes_blocks_settles_and_gives_back() -> None:
    """Permits come in blocks; answers and the unused rest are written back to the row."""
    store = FakeStore(seen(20, 60), 0)
    shared = SharedBudget(store, "c", reserve=0.1, clock=lambda: T0, block=3)
    assert await shared.ready() == 0.0
    assert (store.reserved, shared.held) == (3, 3)
    tag = shared.take()
    assert tag == at(60)
    assert await shared.ready() == 0.0
    assert store.calls == 1  # still two in the block
    shared.settle(tag, replace_seen(seen(15, 60), observed_at=at(1)))
    await shared.flush(release=True)
    assert store.row is not None
    assert (store.row.remaining, store.reserved, shared.held) == (15, 0, 0)


@pytest.mark.anyio
async def test_the_shell_gives_back_a_block_whose_window_is_ending() -> None:
    """Near the reset the held permits go back to the row instead of being sent late."""
    store, wall = FakeStore(seen(20, 60), 0), [T0]
    shared = SharedBudget(store, "c", reserve=0.1, clock=lambda: wall[-1], block=3)
    await shared.ready()
    wall.append(at(59.5))
    assert await shared.ready() == pytest.approx(1.5)
    assert (store.reserved, shared.held) == (0, 0)


@pytest.mark.anyio
async def test_the_shell_refuses_take_without_a_permit() -> None:
    """take() is only valid after ready() answered 0.0."""
    shared = SharedBudget(FakeStore(seen(0, 60)), "c", reserve=0.1, clock=lambda: T0)
    assert await shared.ready() > 0
    with pytest.raises(RuntimeError):
        shared.take()


# -- the row transaction, on both backends (`store_url`) ------------------------------------


def test_update_budget_creates_the_row_once_and_serializes_writers(store_url: str) -> None:
    """Eight stores racing to create the row, then to take permits: exactly the allowance."""
    barrier = threading.Barrier(8)
    granted: list[int] = []
    first = seen(30, 3600, limit=30)  # 27 usable after the 10% reserve

    def create_or_take(row: BudgetSeen | None, reserved: int) -> tuple[Any, int, int]:
        if row is None:
            return first, 0, 0
        new_row, new_reserved, got = grant(
            row, reserved, now=T0, want=1, reserve=0.1, probe_timeout=PROBE
        )
        return new_row, new_reserved, got.granted

    def worker() -> None:
        with Store.open(store_url) as store:
            barrier.wait(timeout=30)
            for _ in range(6):
                granted.append(store.update_budget("client", create_or_take))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert len(granted) == 48
    assert sum(granted) == 27
    with Store.open(store_url) as store:
        assert store.budget_seen("client") == first
        assert store.update_budget("client", lambda row, reserved: (row, reserved, reserved)) == 27


def test_update_budget_without_an_observation_writes_nothing(store_url: str) -> None:
    """A decision that returns no observation leaves a missing row missing."""
    with Store.open(store_url) as store:
        assert store.update_budget("client", lambda row, reserved: (None, 5, "done")) == "done"
        assert store.budget_seen("client") is None


@pytest.mark.anyio
async def test_shared_budgets_of_several_stores_never_overgrant(store_url: str) -> None:
    """Four shells on four stores, taking and settling concurrently: the row's allowance holds."""
    with Store.open(store_url) as setup:
        setup.update_budget("client", lambda row, reserved: (seen(41, 3600, limit=40), 0, None))
    stores = [Store.open(store_url) for _ in range(4)]
    taken: list[int] = []
    try:

        async def spend(store: Store) -> None:
            shared = SharedBudget(store, "client", reserve=0.1, clock=lambda: T0, block=2)
            mine = 0
            for _ in range(30):
                if await shared.ready() > 0:
                    break
                shared.take()
                mine += 1
            await shared.flush(release=True)
            taken.append(mine)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for store in stores:
                    tg.start_soon(spend, store)
    finally:
        for store in stores:
            store.close()
    assert sum(taken) == 37  # floor(41 - 4)
