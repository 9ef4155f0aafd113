"""The freshness plan of a pass: the budget an hour, spread over the users' change rates.

Read once before each pass (`poll.schedule = "adaptive"` only): the budget the service
last reported (less `ratelimit.reserve`; the configured fallback rate before any), less
the re-checks of parked, unlinked and rejected users, is shared by the active users with
`domain.plan_scale` over their stored rate buckets, and the day's shape from a sample of
their estimates. Everything else is pure, in `domain`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from lta_worker.domain import (
    PolicyConfig,
    SchedulePlan,
    class_intervals,
    day_shape,
    expected_delay,
    from_buckets,
    plan_capacity,
    plan_scale,
)

if TYPE_CHECKING:
    from lta_worker.config import Settings
    from lta_worker.storage import Store

REPLAN: Final = timedelta(minutes=10)
"""How long a plan is used before the users are scanned again (estimates move slowly)."""


def budget_for_active(store: Store, settings: Settings) -> float:
    """Reads an hour the active users may spend: the budget less the re-checks."""
    seen = store.budget_seen(settings.client.id)
    counts = store.count_by_state()
    capacity = plan_capacity(
        users_by_state={**counts, "active": 0},
        reads_per_active_user=2,
        interval=settings.poll.interval,
        parked_interval=settings.poll.parked_interval,
        reserve=settings.ratelimit.reserve,
        budget_limit=seen.limit if seen else None,
        budget_window_seconds=seen.window_seconds if seen else None,
        fallback_per_hour=settings.ratelimit.fallback_per_hour,
    )
    return max(capacity.available_per_hour - capacity.reads_needed_per_hour, 0.0)


def schedule_summary(store: Store, settings: Settings) -> dict[str, Any]:
    """What `status` shows of the schedule: the mode and, per class of active user, how
    many and the interval the current plan gives them (plus the parked re-check)."""
    poll = settings.poll
    policy = PolicyConfig.from_settings(poll)
    rates = from_buckets(store.rate_buckets())
    if policy.schedule == "adaptive":
        budget = budget_for_active(store, settings)
        plan = plan_scale(rates, budget, policy.freshness)
        classes = [
            {"class": name, "users": int(users), "interval_s": round(seconds)}
            for name, users, seconds in class_intervals(rates, plan, policy.freshness)
        ]
    else:
        budget, plan = None, SchedulePlan()
        active = int(sum(weight for _, _, weight in rates))
        classes = [
            {"class": "active", "users": active, "interval_s": round(poll.interval.total_seconds())}
        ]
    counts = store.count_by_state()
    rechecked = sum(counts.get(s, 0) for s in ("parked", "unlinked"))
    classes.append(
        {
            "class": "parked",
            "users": rechecked,
            "interval_s": round(poll.parked_interval.total_seconds()),
        }
    )
    return {
        "mode": policy.schedule,
        "stats": policy.stats,
        "budget_per_hour": None if budget is None else round(budget, 1),
        "max_interval_s": round(poll.max_interval.total_seconds()),
        "classes": classes,
    }


class PlanCache:
    """The last plan and when it was made: `serve` passes every `poll.tick`, and the plan
    (a scan of the users table) needs renewing only every `REPLAN`."""

    def __init__(self) -> None:
        self.plan: SchedulePlan | None = None
        self.made_at: datetime | None = None

    def get(
        self, store: Store, settings: Settings, policy: PolicyConfig, now: datetime
    ) -> SchedulePlan:
        """The cached plan while younger than `REPLAN`, else a new one."""
        if policy.schedule != "adaptive":
            return SchedulePlan()
        if self.plan is None or self.made_at is None or now - self.made_at >= REPLAN:
            self.plan, self.made_at = plan_for_pass(store, settings, policy), now
        return self.plan


def plan_for_pass(store: Store, settings: Settings, policy: PolicyConfig) -> SchedulePlan:
    """The plan the pass schedules with (the empty plan under `poll.schedule = "fixed"`)."""
    if policy.schedule != "adaptive":
        return SchedulePlan()
    budget = budget_for_active(store, settings)
    rates = from_buckets(store.rate_buckets())
    plan = plan_scale(rates, budget, policy.freshness)
    return SchedulePlan(
        plan.scale,
        plan.budget_per_hour,
        day_shape(store.sample_estimates()),
        expected_delay(rates, plan, policy.freshness),
    )
