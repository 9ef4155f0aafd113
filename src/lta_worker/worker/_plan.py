"""The freshness plan of a pass: the budget an hour, spread over the users' change rates.

Read once before each pass (`poll.schedule = "adaptive"` only): the budget the service
last reported (less `ratelimit.reserve`; the configured fallback rate before any), less
the re-checks of parked, unlinked and rejected users, is shared by the active users with
`domain.plan_scale` over their stored rate buckets, and the day's shape from a sample of
their estimates. Everything else is pure, in `domain`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lta_worker.domain import (
    PolicyConfig,
    SchedulePlan,
    day_shape,
    from_buckets,
    plan_capacity,
    plan_scale,
)

if TYPE_CHECKING:
    from lta_worker.config import Settings
    from lta_worker.storage import Store


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


def plan_for_pass(store: Store, settings: Settings, policy: PolicyConfig) -> SchedulePlan:
    """The plan the pass schedules with (the empty plan under `poll.schedule = "fixed"`)."""
    if policy.schedule != "adaptive":
        return SchedulePlan()
    budget = budget_for_active(store, settings)
    plan = plan_scale(from_buckets(store.rate_buckets()), budget, policy.freshness)
    return SchedulePlan(plan.scale, plan.budget_per_hour, day_shape(store.sample_estimates()))
