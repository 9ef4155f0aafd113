"""What the budget allows: the capacity plan for the configured interval (`plan_capacity`,
for `status`), and the adaptive schedule's spread of it over users (`plan_scale`, planned once
a pass; each user's next read then follows, `_freshness.next_due`). docs/config.md, *Freshness*.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from lta_worker.domain._durations import format_duration
from lta_worker.domain._estimate import (
    BINS,
    DEFAULT_PRIOR,
    EXPONENT,
    HOUR,
    MAX_RATE,
    ChangeEstimate,
)
from lta_worker.domain._freshness import (
    FreshnessConfig,
    SchedulePlan,
    cap_seconds,
    interval_for,
    turn_cost,
)
from lta_worker.domain._policy import RECHECKED_STATES

# The longest interval the plan states (a budget of 0, or of one read a century, is no
# plan: it is a warning); beyond it a timedelta would overflow.
LONGEST: Final = timedelta(days=36500)


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """Reads needed per hour against reads available per hour, and the interval users get.

    Without a budget seen, `available_per_hour` is the fallback rate (`budget_known` False);
    `rechecks_per_hour` is the part re-checking users at `parked_interval`.
    """

    reads_needed_per_hour: float
    rechecks_per_hour: float
    available_per_hour: float
    budget_known: bool
    configured_interval: timedelta
    effective_interval: timedelta
    sustainable: bool
    warning: str | None


def per_hour(limit: float, window_seconds: float | None) -> float:
    """Reads an hour a reported limit allows over its window (an hour when not reported);
    whatever is stored, a finite number at least 0 (a window is at least a second)."""
    window = window_seconds if window_seconds is not None and window_seconds > 0 else HOUR
    reads = max(limit, 0) * HOUR / max(window, 1.0)
    return reads if math.isfinite(reads) else 0.0


def plan_capacity(
    *,
    users_by_state: Mapping[str, int],
    reads_per_active_user: float,
    interval: timedelta,
    parked_interval: timedelta,
    reserve: float,
    budget_limit: int | None,
    budget_window_seconds: float | None,
    fallback_per_hour: float,
    interval_key: str = "poll.interval",
) -> CapacityPlan:
    """The reads per hour the enrolled users need against what the budget allows, with a
    warning (naming `interval_key`) when it cannot sustain the configured interval.

    Users in `RECHECKED_STATES` cost one read per `parked_interval`. Without a reported
    window an hour is assumed, for this estimate only (the pacer never assumes it). The
    budget is per client: more instances share it, they do not add to it.
    """
    active = users_by_state.get("active", 0)
    rechecked = sum(users_by_state.get(s, 0) for s in RECHECKED_STATES)
    rechecks = rechecked * HOUR / parked_interval.total_seconds()
    needed = active * reads_per_active_user * HOUR / interval.total_seconds() + rechecks

    known = budget_limit is not None
    if budget_limit is not None:
        available = per_hour(budget_limit, budget_window_seconds) * (1.0 - reserve)
    else:
        available = fallback_per_hour

    if needed <= 0 or available >= needed:
        effective = interval
    elif needed < available * (LONGEST / interval):
        effective = timedelta(seconds=interval.total_seconds() * needed / available)
    else:
        effective = LONGEST
    sustainable = needed <= available
    warning = None
    if budget_limit is not None and budget_limit <= 0:
        warning = (
            "the service reports a limit of 0: no read can be made until it allows some "
            "(reads resume by themselves when it does); ask for a budget"
        )
    elif not sustainable:
        warning = (
            f"the budget allows about {available:.0f} reads/h but the enrolled users need "
            f"{needed:.0f} reads/h at the configured interval: each user will be read about "
            f"every {format_duration(effective)} instead; raise {interval_key} or ask for "
            "a larger budget"
        )
    return CapacityPlan(
        reads_needed_per_hour=needed,
        rechecks_per_hour=rechecks,
        available_per_hour=available,
        budget_known=known,
        configured_interval=interval,
        effective_interval=effective,
        sustainable=sustainable,
        warning=warning,
    )


# The share of the budget the schedule plans to spend. More than all of it: the plan
# counts steady intervals, and users waking and sleeping by time zone leave reads unused
# at quiet hours unless a small queue of due users is always waiting (B5 at 100/h per
# 400: 1.0 leaves 7 % of the reads unused, 1.2 under 1 %; 1.35 queues too long).
PLAN_SHARE: Final = 1.2

# Classes of users by estimated changes per day, for `status` (upper bounds, exclusive).
RATE_CLASSES: Final[tuple[tuple[str, float], ...]] = (
    ("idle", 0.5),
    ("light", 4.0),
    ("busy", 16.0),
    ("heavy", math.inf),
)


def reads_per_hour(
    rates: Iterable[tuple[float, float, float]], scale: float, cfg: FreshnessConfig
) -> float:
    """Reads an hour the users (planning rate, mean rate, how many) cost at `scale`."""
    total = 0.0
    plan = SchedulePlan(scale)
    for rate, mean, weight in rates:
        interval = interval_for(rate, plan, cfg)
        total += weight * turn_cost(mean, interval, cfg) / interval
    return total * HOUR


def plan_scale(
    rates: Iterable[tuple[float, float, float]], budget_per_hour: float, cfg: FreshnessConfig
) -> SchedulePlan:
    """The scale at which the users `rates` (from `bucket_rates`) spend `PLAN_SHARE` of
    `budget_per_hour`: 0 when it covers all at `interval`; all at `max_interval` when it does
    not cover that (the claim's order, oldest due first, shares what there is)."""
    table = [(r, m, w) for r, m, w in rates if w > 0]
    budget = budget_per_hour * PLAN_SHARE
    if cfg.schedule == "fixed" or not table or reads_per_hour(table, 0.0, cfg) <= budget:
        return SchedulePlan(0.0, budget_per_hour)
    positive = [r for r, _, _ in table if r > 0] or [MAX_RATE]
    # Every user at the cap: scale^2 * read_cost >= rate * cap^2, read_cost >= 1/2.
    high = cap_seconds(cfg) * math.sqrt(2 * max(positive))
    if not reads_per_hour(table, high, cfg) < budget:  # a budget of 0 too
        return SchedulePlan(high, budget_per_hour)
    low = cfg.interval.total_seconds() * min(positive) ** EXPONENT
    for _ in range(60):  # bisection in log space: the reads fall as the scale grows
        mid = math.sqrt(low * high)
        if reads_per_hour(table, mid, cfg) > budget:
            low = mid
        else:
            high = mid
        if high / low < 1.001:
            break
    return SchedulePlan(high, budget_per_hour)


def expected_delay(
    rates: Iterable[tuple[float, float, float]], plan: SchedulePlan, cfg: FreshnessConfig
) -> float | None:
    """The mean delay in seconds from a change upstream to its arrival that `plan` gives the
    users `rates`: sum(n m I / 2) / sum(n m) over their steady intervals; None without users."""
    changes = delay = 0.0
    for rate, mean, weight in rates:
        changes += weight * mean
        delay += weight * mean * interval_for(rate, plan, cfg) / 2
    return delay / changes if changes > 0 else None


def day_shape(estimates: Iterable[ChangeEstimate]) -> tuple[float, ...]:
    """The users' summed sqrt(rate) per hour of the day, over its mean (`SchedulePlan`)."""
    sums = [0.0] * BINS
    for est in estimates:
        for index, rate in enumerate(est.rates()):
            sums[index] += rate**EXPONENT
    mean = sum(sums) / BINS
    if mean <= 0:
        return (1.0,) * BINS
    return tuple(max(s / mean, 0.05) for s in sums)


# The share of the population's prior kept from `DEFAULT_PRIOR`, so that no rate of the
# grid is ever ruled out for a new user or one starting over.
PRIOR_FLOOR: Final = 0.1


def population_prior(estimates: Iterable[ChangeEstimate]) -> tuple[float, ...]:
    """The prior over `_estimate.GRID` learned from the users (empirical Bayes): the mean
    of their beliefs (an EM step for the mixing weights of the population's rates; each
    plan takes one more), with `PRIOR_FLOOR` of the default prior mixed in."""
    sums = [0.0] * len(DEFAULT_PRIOR)
    count = 0
    for est in estimates:
        if est.belief is None:
            continue
        count += 1
        for k, b in enumerate(est.belief):
            sums[k] += b
    if not count:
        return DEFAULT_PRIOR
    return tuple(
        (1 - PRIOR_FLOOR) * s / count + PRIOR_FLOOR * d
        for s, d in zip(sums, DEFAULT_PRIOR, strict=True)
    )


def rate_class(per_day: float) -> str:
    """The `status` class of a user changing `per_day` times a day."""
    for name, upper in RATE_CLASSES:
        if per_day < upper:
            return name
    return RATE_CLASSES[-1][0]


def bucket_rates(estimates: Iterable[ChangeEstimate]) -> list[tuple[float, float, float]]:
    """Group users into log-spaced buckets of (planning rate, mean rate, how many): 9 % and
    19 % wide, enough for the plan, and a few hundred buckets however many users."""
    buckets: dict[tuple[int, int], float] = {}
    for est in estimates:
        key = est.buckets()
        buckets[key] = buckets.get(key, 0.0) + 1.0
    return from_buckets(buckets.items())


def from_buckets(
    counts: Iterable[tuple[tuple[int, int], float]],
) -> list[tuple[float, float, float]]:
    """(planning rate, mean rate, how many) from counts per `ChangeEstimate.buckets()` key."""
    return [(2 ** (a / 8), 2 ** (b / 4), n) for (a, b), n in sorted(counts)]


def class_intervals(
    rates: Iterable[tuple[float, float, float]], plan: SchedulePlan, cfg: FreshnessConfig
) -> list[tuple[str, float, float, float | None]]:
    """Per class of user (`RATE_CLASSES`) with users: (class, users, mean steady interval in
    seconds, `expected_delay` of the class, None when it is not expected to change)."""
    users: dict[str, float] = {}
    seconds: dict[str, float] = {}
    members: dict[str, list[tuple[float, float, float]]] = {}
    for rate, mean, weight in rates:
        name = rate_class(mean * 24 * HOUR)
        users[name] = users.get(name, 0.0) + weight
        seconds[name] = seconds.get(name, 0.0) + weight * interval_for(rate, plan, cfg)
        members.setdefault(name, []).append((rate, mean, weight))
    return [
        (name, users[name], seconds[name] / users[name], expected_delay(members[name], plan, cfg))
        for name, _ in RATE_CLASSES
        if users.get(name)
    ]
