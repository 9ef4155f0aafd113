"""The freshness plan a pass uses (`PlanCache`): made from what the store holds, renewed
every few minutes (the plan's arithmetic is the domain's: tests/domain/test_freshness.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lta_worker.config import PollSettings, build_settings
from lta_worker.domain import (
    DEFAULT_PRIOR,
    RECHECKED_STATES,
    BudgetSeen,
    ChangeEstimate,
    SchedulePlan,
    observe,
    population_prior,
)
from lta_worker.domain._freshness import FreshnessConfig
from lta_worker.report import PlanCache, budget_moved, capacity_plan, schedule_summary
from lta_worker.report._status import REPLAN, for_active
from support.configs import BASE

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def _settings(client: dict[str, object] | None = None, **sections: dict[str, object]) -> Any:
    """Settings with an API, client `c` (with `client`) and the given sections."""
    return build_settings({**BASE, "client": {"id": "c", **(client or {})}, **sections})


ADAPTIVE = FreshnessConfig(
    schedule="adaptive",
    interval=timedelta(minutes=15),
    max_interval=timedelta(hours=24),
    stats="on_change",
    stats_max_age=timedelta(hours=24),
    rate_half_life=timedelta(days=3),
)


class FakeStore:
    """What `plan_for_pass` reads of the store, counting the scans of the users table."""

    def __init__(self) -> None:
        self.scans = 0
        self.seen: BudgetSeen | None = None

    def budget_seen(self, client_id: str) -> BudgetSeen | None:
        return self.seen

    def count_by_state(self) -> dict[str, int]:
        return {"active": 100, "parked": 4}

    def rate_buckets(self) -> list[tuple[tuple[int, int], float]]:
        self.scans += 1
        return [(ChangeEstimate().buckets(), 100.0)]

    def sample_estimates(self) -> list[ChangeEstimate]:
        busy = ChangeEstimate()
        for n in range(20):
            busy = observe(busy, str(n), NOW + n * HOUR, ADAPTIVE)
        return [ChangeEstimate(), busy]


def test_the_plan_is_made_from_the_store_and_renewed_every_few_minutes() -> None:
    """The adaptive plan is made from the store and renewed each `REPLAN`; `fixed` reads nothing."""
    settings = _settings(
        poll={"schedule": "adaptive", "interval": "15m"}, ratelimit={"fallback_per_hour": 20.0}
    )
    policy = settings.poll.policy()
    store, cache = FakeStore(), PlanCache()
    plan = cache.get(store, settings, policy, NOW)  # type: ignore[arg-type]
    assert plan.scale > 0  # 20 reads an hour cannot read 100 users every 15 minutes
    assert plan.budget_per_hour == pytest.approx(20.0 - 4 / 24)
    assert cache.get(store, settings, policy, NOW + REPLAN / 2) is plan  # type: ignore[arg-type]
    cache.get(store, settings, policy, NOW + REPLAN)  # type: ignore[arg-type]
    assert store.scans == 2
    assert plan.expected_delay_s is not None
    assert plan.expected_delay_s > ADAPTIVE.interval.total_seconds() / 2
    assert plan.prior == population_prior(store.sample_estimates())
    assert plan.prior != DEFAULT_PRIOR
    fixed = PollSettings(schedule="fixed").policy()
    assert PlanCache().get(None, settings, fixed, NOW) == SchedulePlan()  # type: ignore[arg-type]


def _seen(limit: int | None, window: float | None = 3600.0) -> BudgetSeen:
    return BudgetSeen(limit, limit, None, window, NOW)


@pytest.mark.parametrize(
    ("planned", "seen", "moved"),
    [
        (None, None, False),  # nothing reported: the fallback holds
        (None, _seen(1200), True),  # a new install's first limit
        (_seen(100), _seen(199), False),
        (_seen(100), _seen(200), True),  # raised twice as large
        (_seen(100), _seen(50), True),  # lowered to half
        (_seen(100), _seen(51), False),
        (_seen(100), _seen(100, 60.0), True),  # the same limit a minute: 60 times as many
        (_seen(100), _seen(None), False),  # a report without a limit says nothing new
        (_seen(100), None, False),
    ],
)
def test_a_plan_is_out_of_date_once_the_budget_reported_moved(
    planned: BudgetSeen | None, seen: BudgetSeen | None, moved: bool
) -> None:
    """A plan's budget moved with a first limit, or one twice or half as large an hour."""
    assert budget_moved(planned, seen) is moved


def test_the_plan_is_made_again_at_once_when_the_stored_budget_moved() -> None:
    """A plan made from the fallback is made again once the store holds a limit that moved."""
    settings = _settings(
        poll={"schedule": "adaptive", "interval": "15m"},
        ratelimit={"fallback_per_hour": 20.0, "reserve": 0.0},
    )
    policy = settings.poll.policy()
    store, cache = FakeStore(), PlanCache()
    fallback = cache.get(store, settings, policy, NOW)  # type: ignore[arg-type]
    store.seen = _seen(1200)
    plan = cache.get(store, settings, policy, NOW + REPLAN / 10)  # type: ignore[arg-type]
    assert plan is not fallback and plan.budget_per_hour == pytest.approx(1200 - 4 / 24)
    store.seen = _seen(1500)
    assert cache.get(store, settings, policy, NOW + REPLAN / 5) is plan  # type: ignore[arg-type]
    assert store.scans == 2


class _Buckets:
    """The store's users as `schedule_summary` reads them: 100 new active users."""

    def rate_buckets(self) -> list[tuple[tuple[int, ...], float]]:
        return [(ChangeEstimate().buckets(), 100.0)]


def test_status_and_the_plan_map_the_settings_to_capacity_once() -> None:
    """`status`'s capacity and the plan's budget come from one mapping (`capacity_plan`)."""
    settings = _settings(
        {"scopes": ["cloud-sync.permanent.latest-change"]},
        poll={"schedule": "adaptive", "interval": "15m"},
        ratelimit={"fallback_per_hour": 20.0},
    )
    counts = {"active": 100, "parked": 4, "unlinked": 1, "rejected": 1, "revoked": 3}
    capacity = capacity_plan(settings, counts, None)
    assert capacity.rechecks_per_hour == pytest.approx(6 / 24)
    assert capacity.reads_needed_per_hour == pytest.approx(100 / 24 + 6 / 24)
    assert capacity.warning is None  # 20 an hour covers everyone at max_interval (24 h)
    assert for_active(capacity) == pytest.approx(20 - 6 / 24)
    summary = schedule_summary(_Buckets(), settings, counts, capacity)  # type: ignore[arg-type]
    assert summary["budget_per_hour"] == round(20 - 6 / 24, 1)
    rechecked = [
        {"class": state, "users": n, "interval_s": 86400, "expected_delay_s": None}
        for state, n in (("parked", 4), ("unlinked", 1), ("rejected", 1))
    ]
    assert summary["classes"][-3:] == rechecked  # each state its own, not all `parked`


def test_under_the_adaptive_schedule_the_capacity_warning_is_about_max_interval() -> None:
    """Adaptive: the capacity warning is about `poll.max_interval` (fixed: `poll.interval`)."""
    client = {"scopes": ["cloud-sync.permanent.latest-change"]}
    for schedule, key in (("adaptive", "poll.max_interval"), ("fixed", "poll.interval")):
        poll = {"schedule": schedule, "interval": "15m"}
        settings = _settings(client, poll=poll, ratelimit={"fallback_per_hour": 2.0})
        warning = capacity_plan(settings, {"active": 100}, None).warning
        assert warning is not None and f"raise {key} or" in warning


class _Learned(FakeStore):
    """A store of 20 busy (hourly change) and 80 idle (none in four days) learned users."""

    def __init__(self) -> None:
        super().__init__()
        busy = idle = ChangeEstimate()
        for n in range(48):
            busy = observe(busy, str(n), NOW + n * HOUR, ADAPTIVE)
        for n in range(0, 96, 6):
            idle = observe(idle, "same", NOW + n * HOUR, ADAPTIVE)
        self.estimates = [busy] * 20 + [idle] * 80

    def count_by_state(self) -> dict[str, int]:
        return {"active": 100}

    def rate_buckets(self) -> list[tuple[tuple[int, int], float]]:
        counts: dict[tuple[int, int], float] = {}
        for est in self.estimates:
            counts[est.buckets()] = counts.get(est.buckets(), 0.0) + 1.0
        return sorted(counts.items())

    def sample_estimates(self) -> list[ChangeEstimate]:
        return self.estimates


def test_status_shows_each_learned_class_and_the_metric_its_mean_delay() -> None:
    """Issue 29 item 6: `status` shows each learned class's size, interval and expected delay."""
    settings = _settings(
        poll={"schedule": "adaptive", "interval": "15m", "stats": "on_change"},
        ratelimit={"fallback_per_hour": 40.0},
    )
    store, counts = _Learned(), {"active": 100}
    summary = schedule_summary(store, settings, counts, capacity_plan(settings, counts, None))  # type: ignore[arg-type]
    learned = {c["class"]: c for c in summary["classes"] if c["class"] not in RECHECKED_STATES}
    assert len(learned) == 2, learned
    busy, idle = sorted(learned.values(), key=lambda c: c["interval_s"])
    assert (busy["users"], idle["users"]) == (20, 80)
    assert 900 <= busy["interval_s"] < idle["interval_s"] <= 86400
    for c in (busy, idle):
        assert abs(c["expected_delay_s"] - c["interval_s"] / 2) <= 1
    plan = PlanCache().get(store, settings, settings.poll.policy(), NOW)  # type: ignore[arg-type]
    assert plan.expected_delay_s is not None  # the metric's value
    assert summary["expected_delay_s"] == round(plan.expected_delay_s)
    assert busy["expected_delay_s"] <= summary["expected_delay_s"] < idle["expected_delay_s"]
