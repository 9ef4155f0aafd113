"""The pacer's shell with instances in mind: a waiter wakes when an answer is fed."""

from __future__ import annotations

import time

import anyio
import pytest

from lta_worker.worker.pacer import Pacer, PacerCore

pytestmark = pytest.mark.anyio

FRESH = {"ratelimit": '"p";r=1000;t=60', "ratelimit-policy": '"p";q=1000;w=60'}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.timeout(10)
async def test_a_waiting_acquire_wakes_when_an_answer_is_fed() -> None:
    """A waiter held by the blind fallback rate goes as soon as a fresh header arrives,
    not at its next periodic re-check (a second later)."""
    pacer = Pacer(PacerCore(fallback_per_hour=3600, initial_burst=1), time.monotonic, anyio.sleep)
    await pacer.acquire()  # the one blind permit; the next waits a second
    done = anyio.Event()

    async def second() -> None:
        await pacer.acquire()
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        await anyio.sleep(0.05)
        began = time.monotonic()
        pacer.feed(FRESH, 200, elapsed=0.01)
        with anyio.fail_after(5):
            await done.wait()
    assert time.monotonic() - began < 0.5
