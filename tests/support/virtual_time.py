"""Virtual time for whole passes: trio's `MockClock`, which both the worker's and the
simulator's clocks read, moved by `autojump` to the next deadline only when every task waits
AND no worker thread (`anyio.to_thread`, a database call) is busy: jumping while one runs
would skip a timer ahead of work still in progress. Use `virtual_backend()` as the module's
`anyio_backend`, `VirtualTime` as the clock, and the test's body inside `async with autojump():`.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import trio
import trio.testing
from trio.testing import MockClock

START = datetime(2025, 1, 1, tzinfo=UTC)
_THREAD_POLL_S = 0.0002  # real time to let busy worker threads progress
# Worker threads waiting on the virtual clock (`stall`): borrowed from the limiter, not busy.
_stalled = {"threads": 0}


def virtual_backend() -> tuple[str, dict[str, Any]]:
    """The anyio backend (trio) with a mock clock that stands still until `autojump` moves it."""
    return ("trio", {"clock": MockClock()})


@asynccontextmanager
async def autojump() -> AsyncIterator[None]:
    """Move the mock clock to the next deadline whenever nothing else can make progress."""
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, MockClock), "use virtual_backend() as the anyio_backend"
    limiter = anyio.to_thread.current_default_thread_limiter()

    async def drive() -> None:
        while True:
            await trio.testing.wait_all_tasks_blocked()
            if limiter.borrowed_tokens > _stalled["threads"]:
                # Wait in real time for the worker threads; trio's own thread is not
                # counted by anyio's limiter, and the clock moves only by this driver.
                await trio.to_thread.run_sync(time.sleep, _THREAD_POLL_S)
                continue
            jump = trio.lowlevel.current_statistics().seconds_to_next_deadline
            if 0 < jump < math.inf:
                clock.jump(jump)
            await trio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(drive)
        yield
        tg.cancel_scope.cancel()


def stall(seconds: float) -> None:
    """From a worker thread: block it for `seconds` of virtual time (a database that holds
    the bytes), without holding the clock still as a busy thread does."""
    anyio.from_thread.run(_stall, seconds)


async def _stall(seconds: float) -> None:
    _stalled["threads"] += 1  # counted on the loop's thread, as the sleep is about to be set
    try:
        await anyio.sleep(seconds)
    finally:
        _stalled["threads"] -= 1


class VirtualTime:
    """The worker's `Clock` and the simulator's clock over trio's (mock) clock, inside the run."""

    def __init__(self, start: datetime = START) -> None:
        self.start = start

    def now(self) -> datetime:
        """Wall time: the start plus the virtual seconds elapsed."""
        return self.start + timedelta(seconds=trio.current_time())

    def monotonic(self) -> float:
        """The virtual seconds elapsed."""
        return trio.current_time()

    async def sleep(self, seconds: float) -> None:
        """Sleep on the virtual clock."""
        await anyio.sleep(seconds)
