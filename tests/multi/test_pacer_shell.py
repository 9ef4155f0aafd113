"""The pacer's shell with instances in mind: a waiter wakes when an answer is fed, and with a
shared budget every permit also comes from the row and every answer is settled into it."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import anyio
import pytest

from lta_worker.config import RateLimitSettings
from lta_worker.domain import BudgetSeen
from lta_worker.pacing import Pacer, PacerCore, SharedBudget
from support.storage import FakeStore

pytestmark = pytest.mark.anyio

FRESH = {"ratelimit": '"p";r=1000;t=60', "ratelimit-policy": '"p";q=1000;w=60'}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.timeout(10)
async def test_a_waiting_acquire_wakes_when_an_answer_is_fed() -> None:
    """A waiter held by the fallback rate goes as soon as a fresh header is fed."""
    pacer = Pacer(
        PacerCore(RateLimitSettings(fallback_per_hour=3600), initial_burst=1),
        time.monotonic,
        anyio.sleep,
        wall_clock=lambda: datetime.now(UTC),
    )
    await pacer.acquire()  # the one blind permit; the next waits a second
    done = anyio.Event()

    async def second() -> None:
        await pacer.acquire()
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        await anyio.sleep(0.05)
        began = time.monotonic()
        pacer.feed(None, FRESH, 200, elapsed=0.01)
        with anyio.fail_after(5):
            await done.wait()
    assert time.monotonic() - began < 0.5


@pytest.mark.timeout(10)
async def test_with_a_shared_budget_permits_come_from_the_row() -> None:
    """With a shared budget, acquire waits once the row is spent, whatever the core allows."""
    wall = datetime.now(UTC)
    row = BudgetSeen(100, 13, wall + timedelta(seconds=3), 4.0, wall)  # floor(13 - 10) = 3
    store = FakeStore(row, 0)
    shared = SharedBudget(store, "c", reserve=0.1, clock=lambda: wall, block=2)
    pacer = Pacer(
        PacerCore(initial_burst=5),
        time.monotonic,
        anyio.sleep,
        wall_clock=lambda: datetime.now(UTC),  # the answer comes after the row's figures
        shared=shared,
    )
    with anyio.fail_after(5):
        permit = await pacer.acquire()
        # This instance saw more (an earlier figure of the same window): 40 for the core.
        pacer.feed(permit, {"ratelimit": '"p";r=50;t=3', "ratelimit-policy": '"p";q=100;w=4'}, 200)
        for _ in range(3):
            await pacer.acquire()
    with anyio.move_on_after(0.3) as waited:
        await pacer.acquire()
    assert waited.cancelled_caught  # the row is spent although the core would go on
    await shared.flush(release=True)
    assert store.row is not None
    assert (store.row.remaining, store.row.reset_at) == (13, row.reset_at)  # the lower stays
    assert store.reserved == 3  # three still out
