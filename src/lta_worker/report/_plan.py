"""The freshness and capacity plans, from the database (the arithmetic is `domain`'s)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from lta_worker.domain import (
    RECHECKED_STATES,
    USER_STATES,
    BudgetSeen,
    CapacityPlan,
    PolicyConfig,
    SchedulePlan,
    class_intervals,
    day_shape,
    expected_delay,
    from_buckets,
    per_hour,
    plan_capacity,
    plan_scale,
    population_prior,
)

if TYPE_CHECKING:
    from lta_worker.config import Settings
    from lta_worker.storage import Store

REPLAN: Final = timedelta(minutes=10)
"""How long a plan is used before the users are scanned again (estimates move slowly)."""
MOVED: Final = 2.0
"""How many times larger or smaller a reported budget remakes the plan before `REPLAN`."""


def _per_hour(seen: BudgetSeen | None) -> float | None:
    """The reads an hour a report allows, or None without a reported limit."""
    if seen is None or seen.limit is None:
        return None
    return per_hour(seen.limit, seen.window_seconds)


def budget_moved(planned: BudgetSeen | None, seen: BudgetSeen | None) -> bool:
    """Whether a plan from `planned` is stale once `seen`: a limit new, or `MOVED` times off."""
    before, now = _per_hour(planned), _per_hour(seen)
    if now is None:
        return False
    if before is None:
        return True
    return now >= before * MOVED or now * MOVED <= before


def capacity_plan(
    settings: Settings, counts: Mapping[str, int], seen: BudgetSeen | None
) -> CapacityPlan:
    """The capacity plan for these users (per state) and the budget last seen."""
    adaptive = settings.poll.schedule == "adaptive"
    return plan_capacity(
        users_by_state=counts,
        reads_per_active_user=len(settings.client.scopes),
        # The adaptive schedule spreads the budget by change rate and promises only
        # `max_interval`: the budget must cover that, not every user each `interval`.
        interval=settings.poll.policy().max_interval if adaptive else settings.poll.interval,
        interval_key="poll.max_interval" if adaptive else "poll.interval",
        parked_interval=settings.poll.parked_interval,
        reserve=settings.ratelimit.reserve,
        budget_limit=seen.limit if seen else None,
        budget_window_seconds=seen.window_seconds if seen else None,
        fallback_per_hour=settings.ratelimit.fallback_per_hour,
    )


def for_active(capacity: CapacityPlan) -> float:
    """Reads an hour the active users may spend: the budget less the re-checks."""
    return max(capacity.available_per_hour - capacity.rechecks_per_hour, 0.0)


def schedule_summary(
    store: Store, settings: Settings, counts: Mapping[str, int], capacity: CapacityPlan
) -> dict[str, Any]:
    """What `status` shows of the schedule: per class of user, count, interval and mean delay."""
    poll = settings.poll
    policy = poll.policy()
    rates = from_buckets(store.rate_buckets())
    if policy.schedule == "adaptive":
        budget = for_active(capacity)
        plan = plan_scale(rates, budget, policy.freshness)
        classes = [
            _user_class(name, users, seconds, delay)
            for name, users, seconds, delay in class_intervals(rates, plan, policy.freshness)
        ]
        mean_delay = expected_delay(rates, plan, policy.freshness)
    else:
        budget, plan = None, SchedulePlan()
        active = int(sum(weight for _, _, weight in rates))
        every = round(poll.interval.total_seconds())
        # Fixed: a change waits half the interval on average.
        classes = [_user_class("active", active, every, every / 2)]
        mean_delay = every / 2 if active else None
    # One class per re-checked state, each its own users (not all under `parked`), with no
    # delay: re-checked for access, not read for changes.
    parked = poll.parked_interval.total_seconds()
    classes += [
        _user_class(state, counts.get(state, 0), parked, None)
        for state in USER_STATES
        if state in RECHECKED_STATES
    ]
    return {
        "mode": policy.schedule,
        "stats": policy.stats,
        "budget_per_hour": None if budget is None else round(budget, 1),
        "max_interval_s": round(poll.max_interval.total_seconds()),
        "expected_delay_s": None if mean_delay is None else round(mean_delay),
        "classes": classes,
    }


def _user_class(
    name: str, users: float, interval_s: float, delay_s: float | None
) -> dict[str, Any]:
    return {
        "class": name,
        "users": int(users),
        "interval_s": round(interval_s),
        "expected_delay_s": None if delay_s is None else round(delay_s),
    }


class PlanCache:
    """The last plan, when and from which budget it was made (renewed every `REPLAN`)."""

    def __init__(self) -> None:
        self.plan: SchedulePlan | None = None
        self.made_at: datetime | None = None
        self.seen: BudgetSeen | None = None  # the budget the plan was made from

    def get(
        self,
        store: Store,
        settings: Settings,
        policy: PolicyConfig,
        now: datetime,
        seen: BudgetSeen | None = None,
    ) -> SchedulePlan:
        """The cached plan while younger than `REPLAN` and its budget holds, else a new one."""
        if policy.schedule != "adaptive":
            return SchedulePlan()
        if seen is None:
            seen = store.budget_seen(settings.client.id)
        if (
            self.plan is None
            or self.made_at is None
            or now - self.made_at >= REPLAN
            or budget_moved(self.seen, seen)
        ):
            self.plan, self.made_at = plan_for_pass(store, settings, policy, seen), now
            self.seen = seen
        return self.plan


def plan_for_pass(
    store: Store, settings: Settings, policy: PolicyConfig, seen: BudgetSeen | None
) -> SchedulePlan:
    """The plan the pass schedules with (empty under `poll.schedule = "fixed"`)."""
    if policy.schedule != "adaptive":
        return SchedulePlan()
    budget = for_active(capacity_plan(settings, store.count_by_state(), seen))
    rates = from_buckets(store.rate_buckets())
    plan = plan_scale(rates, budget, policy.freshness)
    sample = store.sample_estimates()
    return SchedulePlan(
        plan.scale,
        plan.budget_per_hour,
        day_shape(sample),
        expected_delay(rates, plan, policy.freshness),
        population_prior(sample),
    )
