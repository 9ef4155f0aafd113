"""Stopping a pass (SIGTERM in `serve`, the deadline): reads already sent finish, a turn
waiting for a pacer permit is given up at once, and every user not fully read stays due."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest

from lta_worker.simulator import SimulatorTransport
from lta_worker.worker import PassResult

from .conftest import Gate, Harness

pytestmark = pytest.mark.anyio


@pytest.mark.timeout(30)
async def test_a_stop_does_not_wait_for_permits(realtime_harness: Harness) -> None:
    """A stop ends a permit-starved pass at once; unfinished users keep their schedule."""
    h = realtime_harness
    h.configure("poll", concurrency=3)
    users = [f"user-{n}" for n in range(8)]
    for user in users:
        await h.enroll(user)
    before = {u: h.user(u) for u in users}
    h.sim.configure(budget=6, window=3600)
    h.sim.clear_requests()
    result: PassResult | None = None
    transport = Gate(SimulatorTransport(h.sim))
    transport.release.set()  # not held: `reached` says the first read is answered
    async with h.worker(transport) as worker:

        async def run() -> None:
            nonlocal result
            result = await worker.run_pass()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            with anyio.fail_after(10):
                await transport.reached.wait()
            # One read is back; the budget holds every other read for minutes.
            began = time.monotonic()
            worker.request_stop(10.0)
    took = time.monotonic() - began
    assert result is not None
    assert result.stopped == "cancelled"
    assert took < 2.0
    finished = 0
    for user in users:
        row, old = h.user(user), before[user]
        if row.next_due_at != old.next_due_at:
            finished += 1
            assert row.last_polled_at is not None
        else:
            assert row.state == "active"
    with h.store() as store:
        assert store.count_due(h.clock.now()) == len(users) - finished
    assert finished < len(users)
    first = h.reads()[0].user
    assert h.user(first).last_polled_at is not None  # read before the stop: kept


async def test_a_stop_before_the_engine_exists_claims_no_one(harness: Harness) -> None:
    """A stop requested before a pass's engine exists makes it claim nobody."""
    await harness.enroll("alice")
    harness.sim.clear_requests()
    async with harness.worker() as worker:
        worker.request_stop(10.0)
        result = await worker.run_pass()
    assert result.stopped == "cancelled"
    assert result.users == 0
    assert harness.reads() == []
    with harness.store() as store:
        assert store.count_due(harness.clock.now()) == 1


@pytest.mark.timeout(30)
async def test_a_pacer_that_hands_out_no_permit_fails_the_pass_loudly(harness: Harness) -> None:
    """A pacer whose acquire returns nothing makes the pass raise TypeError."""
    await harness.enroll("x")
    async with harness.worker() as worker:

        async def no_permit() -> None:
            return None

        worker.pacer.acquire = no_permit  # type: ignore[method-assign,assignment]
        with anyio.fail_after(10), pytest.raises(BaseException) as caught:  # noqa: PT011
            await worker.run_pass()
    assert caught.group_contains(TypeError, match="returned no Permit")


@pytest.mark.timeout(30)
async def test_a_stop_while_the_pass_finishes_is_taken_quietly(harness: Harness) -> None:
    """A stop while the pass writes its end is taken quietly; the pass ends as it would have."""
    await harness.enroll("alice")
    finishing, go_on = threading.Event(), threading.Event()
    async with harness.worker() as worker:
        release = worker.store.release

        def held_release(owner: str) -> Any:
            finishing.set()
            go_on.wait(10)
            return release(owner)

        worker.store.release = held_release  # type: ignore[method-assign]
        result: PassResult | None = None

        async def run() -> None:
            nonlocal result
            result = await worker.run_pass()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            assert await anyio.to_thread.run_sync(finishing.wait, 10)
            try:
                worker.request_stop(10.0)
            finally:
                go_on.set()
    assert result is not None
    assert (result.users, result.stopped) == (1, "completed")
