"""A pass makes every store call on a worker thread: when another connection holds the
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

from .conftest import Harness

pytestmark = pytest.mark.anyio

USERS = 30
HOLD_S = 1.0


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
