"""A pass's own mechanics. Stopping it (SIGTERM in `serve`, the deadline): reads already sent
finish, a turn waiting for a pacer permit is given up at once, and every user not fully read
stays due. Its store calls, each on a worker thread: when another connection holds the
database's lock the call waits there, the loop keeps running, and nothing is lost."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from lta_worker.simulator import SimulatorTransport
from lta_worker.storage import Store
from lta_worker.worker import PassResult

from .conftest import Gate, Harness

pytestmark = pytest.mark.anyio

USERS = 30  # of the locked database test
HOLD_S = 1.0


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


class LockOnFirstRead(httpx.AsyncBaseTransport):
    """At the first read, another connection takes the write lock for HOLD_S seconds."""

    def __init__(self, inner: httpx.AsyncBaseTransport, path: Path) -> None:
        self.inner = inner
        self.path = path
        self.locked_at: float | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.locked_at is None and "/api/v1/history/" in request.url.path:
            other = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            other.execute("BEGIN IMMEDIATE")
            self.locked_at = time.monotonic()

            def release() -> None:
                other.execute("COMMIT")
                other.close()

            threading.Timer(HOLD_S, release).start()
        return await self.inner.handle_async_request(request)


def record_threads(monkeypatch: pytest.MonkeyPatch, name: str, seen: list[int]) -> None:
    """Record the thread each call of `Store.<name>` runs on."""
    original: Callable[..., Any] = getattr(Store, name)

    def recorded(self: Store, *args: Any, **kwargs: Any) -> Any:
        seen.append(threading.get_ident())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Store, name, recorded)


async def test_a_locked_database_does_not_stall_the_loop_or_lose_writes(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock held a second mid-pass: calls wait on a thread, the loop goes on, all is written."""
    for n in range(USERS):
        await harness.enroll(f"u{n:02d}")
    path = Path(harness.db_url.removeprefix("sqlite:///"))
    transport = LockOnFirstRead(SimulatorTransport(harness.sim), path)
    loop_thread = threading.get_ident()
    claims: list[int] = []
    applies: list[int] = []
    record_threads(monkeypatch, "claim_due", claims)
    record_threads(monkeypatch, "apply", applies)
    longest_gap = 0.0
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal longest_gap
        last = time.monotonic()
        while not done.is_set():
            await anyio.sleep(0.01)
            now = time.monotonic()
            longest_gap = max(longest_gap, now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        worker = harness.worker(transport)
        async with worker:
            result = await worker.run_pass()
        finished = time.monotonic()
        done.set()

    assert (result.stopped, result.users, result.reads) == ("completed", USERS, 2 * USERS)
    assert transport.locked_at is not None
    assert finished - transport.locked_at >= HOLD_S * 0.9  # the pass waited for the lock
    # ... off the loop, which went on meanwhile: a call on the loop would block it for the
    # rest of the hold; the margin is for a loaded machine (0.56 s seen at load 8)
    assert longest_gap < HOLD_S * 0.8
    assert claims and applies
    assert loop_thread not in claims + applies  # every call went one way: to a thread
    with harness.store() as store:
        rows = list(store.export_results())
        users = list(store.list_users())
    assert len(rows) == 2 * USERS
    assert {(u.state, u.last_outcome) for u in users} == {("active", "ok")}
