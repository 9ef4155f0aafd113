"""A database written under `poll.schedule = "fixed"` switched to the adaptive default, the
keys never named, by another worker instance: it goes on from the estimates and due times the
store holds (its plan is made from the store alone: tests/report/test_plan.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from sqlalchemy import create_engine, text

from support.virtual_time import autojump

from .conftest import Harness

pytestmark = pytest.mark.anyio

HOUR = timedelta(hours=1)
MAX_INTERVAL = timedelta(hours=12)
READ = ("busy", "steady", "idle")  # read every hour under fixed
USERS = (*READ, "flaky", "parked")


def _changed_at(n: int) -> dict[str, str]:
    return {"changed_at": f"2025-01-{1 + n // 24:02}T{n % 24:02}:00:00Z"}


def _rows(h: Harness) -> dict[str, Any]:
    return {u: h.user(u) for u in USERS}


def _due_classes(h: Harness) -> dict[str, str]:
    """Which setting each user's due time was set by (the stored `due_class`)."""
    engine = create_engine(h.db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text('SELECT "user", due_class FROM users'))
            return dict(rows.all())
    finally:
        engine.dispose()


async def _under_fixed(h: Harness) -> None:
    """Twelve hours under `fixed`: busy, steady and idle change apart; parked; flaky backing off."""
    for user in (*READ, "parked"):
        await h.enroll(user, last_sync_age_days=100 if user == "parked" else 1.0)
        h.sim.set_payload(user, "latest-change", _changed_at(0))
    worker = h.worker()
    async with worker:
        await worker.run_pass()
        await anyio.sleep(HOUR.total_seconds() / 2)
        await h.enroll("flaky")
        await worker.run_pass()
        for n in range(1, 13):
            await anyio.sleep(HOUR.total_seconds() / 2)
            h.sim.set_payload("busy", "latest-change", _changed_at(n))
            if n in (4, 8):
                h.sim.set_payload("steady", "latest-change", _changed_at(n))
            await worker.run_pass()
            await anyio.sleep(HOUR.total_seconds() / 2)
            if n == 12:
                h.sim.inject_fault("500", count=1)
            await worker.run_pass()


@pytest.mark.timeout(120)
async def test_a_fixed_database_keeps_every_schedule_when_the_default_turns_adaptive(
    virtual_harness: Harness,
) -> None:
    """Turning adaptive moves no due time not yet reached and goes on from the estimates."""
    h = virtual_harness
    h.configure("poll", interval="1h", backoff_base="20m")  # fixed, stats always: FIXED_POLL
    h.configure("poll", max_interval="12h", max_pass_duration="50m")
    h.sim.configure(budget=1000, window=3600, header_format="draft")
    async with autojump():
        await _under_fixed(h)
        left, left_classes = _rows(h), _due_classes(h)
        assert (left["flaky"].last_outcome, left["flaky"].consecutive_failures) == ("transient", 1)
        assert left["parked"].state == "parked"
        assert all(left[u].estimate.belief is not None for u in READ)

        h.configure("poll", schedule=None, stats=None)  # the old defaults, now never named
        h.sim.configure(budget=4, window=3600)  # too few for every user each hour
        first_read: dict[str, Any] = {}
        worker = h.worker()
        async with worker:
            for user in sorted(("flaky", *READ), key=lambda u: left[u].next_due_at):
                await anyio.sleep(max((left[user].next_due_at - h.clock.now()).total_seconds(), 0))
                seen = len(h.reads())
                await worker.run_pass()
                for e in h.reads()[seen:]:
                    first_read.setdefault(e.user, e.at)
                for other in set(USERS) - set(first_read):  # not read yet: as it was left
                    assert h.user(other) == left[other], other
            after, after_classes = _rows(h), _due_classes(h)
    assert set(first_read) == {"flaky", *READ}
    for user, at in first_read.items():
        assert left[user].next_due_at <= at < left[user].next_due_at + HOUR, user
    assert after["flaky"].consecutive_failures == 0
    assert after["parked"] == left["parked"]  # re-checked at its own time, 24h on
    for user in READ:
        before, now = left[user].estimate, after[user].estimate
        # Gone on from, not reset: a fresh estimate's first read learns nothing (no belief).
        assert now.belief is not None and now.window is not None, user
        assert now.seen_at > before.seen_at
        assert now.level < before.level  # a quiet interval: the rate comes down
        assert (now.content, now.stats_at) == (before.content, before.stats_at)  # no stats read
    for user in ("flaky", *READ):
        row = after[user]
        assert HOUR <= row.next_due_at - row.last_polled_at <= MAX_INTERVAL, user
    # The adaptive schedule set the due times of the users it read, the fixed one none before.
    assert {left_classes[u] for u in ("flaky", *READ)} == {"interval", "backoff"}
    assert {after_classes[u] for u in ("flaky", *READ)} == {"adaptive"}
