"""An adaptive schedule's estimates across a restart and a move to another instance."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from lta_worker.domain import population_prior
from lta_worker.report import PlanCache
from support.virtual_time import autojump

from .conftest import Harness

pytestmark = pytest.mark.anyio


USERS = ("busy", "steady", "idle")


def _changed_at(n: int) -> dict[str, str]:
    return {"changed_at": f"2025-01-{1 + n // 24:02}T{n % 24:02}:00:00Z"}


def _kept(h: Harness) -> dict[str, Any]:
    """What the store keeps of each user's schedule: its estimate and next due time."""
    return {u: (h.user(u).estimate, h.user(u).next_due_at) for u in USERS}


def _endpoints(h: Harness, since: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in h.reads()[since:]:
        out.setdefault(e.user, []).append(e.path.rsplit("/", 1)[-1])
    return out


@pytest.mark.timeout(120)
async def test_a_second_instance_goes_on_from_the_estimates_the_first_left(
    virtual_harness: Harness,
) -> None:
    """A second instance goes on from the first's estimates, due times and prior."""
    h = virtual_harness
    h.configure("poll", schedule="adaptive", interval="10m", max_interval="12h")
    h.configure("poll", stats="on_change", max_pass_duration="30m")
    h.sim.configure(budget=12, window=3600, header_format="draft")  # too few for all at 10m
    async with autojump():
        await _handover(h)


async def _handover(h: Harness) -> None:
    for user in USERS:
        await h.enroll(user)
        h.sim.set_payload(user, "latest-change", _changed_at(0))
    first = h.worker()
    async with first:
        for n in range(1, 13):  # 12 h: busy changes every hour, steady at 4 h and 8 h
            h.sim.set_payload("busy", "latest-change", _changed_at(n))
            if n in (4, 8):
                h.sim.set_payload("steady", "latest-change", _changed_at(n))
            await first.run_pass()
            await anyio.sleep(3600 - h.clock.now().timestamp() % 3600)
        first.plans = PlanCache()
        left_plan = first.plans.get(
            first.store, first.settings, first.settings.poll.policy(), h.clock.now()
        )
    left = _kept(h)
    assert all(est is not None and est.belief is not None for est, _ in left.values())
    with h.store() as store:
        assert left_plan.prior == population_prior(store.sample_estimates())

    second = h.worker()
    assert second.instance != first.instance
    h.sim.set_payload("busy", "latest-change", _changed_at(13))  # only busy changes
    handover: dict[str, list[str]] = {}
    async with second:
        # Each user at its due time, read by the second instance.
        for user in sorted(USERS, key=lambda u: left[u][1]):
            await anyio.sleep(max((left[user][1] - h.clock.now()).total_seconds(), 0))
            seen = len(h.reads())
            await second.run_pass()
            if not handover:  # its first plan, from the store alone: the first's
                assert second.plans.plan == left_plan  # scale, day's shape, prior
            turns = _endpoints(h, seen)
            for name in set(turns) - set(handover):
                handover[name] = turns[name]
                first_read = next(e.at for e in h.reads()[seen:] if e.user == name)
                assert first_read >= left[name][1]  # not before the due time it was left
    after = _kept(h)
    assert handover["busy"] == ["latest-change", "stats"]
    for user in ("steady", "idle"):
        before_est, after_est = left[user][0], after[user][0]
        assert handover[user] == ["latest-change"]
        assert after_est.content == before_est.content
        assert after_est.stats_at == before_est.stats_at  # no stats read: no change seen
        assert after_est.level < before_est.level  # a quiet interval: the rate comes down
        assert after_est.seen_at > before_est.seen_at
    assert after["busy"][0].content != left["busy"][0].content
    assert after["busy"][0].stats_at > left["busy"][0].stats_at
