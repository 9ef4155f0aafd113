"""The budget's spread over users: the scale of the square-root rule that spends the budget.

Pure arithmetic on plain values; no I/O. A pass plans once (`plan_scale` over the users'
estimates grouped by `bucket_rates`, and `day_shape` for the hours they change in); each
user's next read then follows from the plan (`_freshness.next_due`). `status` shows the
effective interval per class of user from the same plan (`class_intervals`), the metrics
the mean delay it expects (`expected_delay`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

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
    """The scale at which the users spend `PLAN_SHARE` of `budget_per_hour`.

    `rates` holds (planning rate, mean rate, how many), as `bucket_rates` gives them.
    When the budget covers every user at `interval`, the scale is 0 (all at `interval`);
    when it does not cover every user at `max_interval`, every user gets `max_interval`
    and the claim's order (oldest due first) shares what there is.
    """
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
    """The mean delay in seconds from a change upstream to its arrival that `plan` gives
    the users `rates` (as `bucket_rates` gives them), at their steady intervals.

    A change waits half its user's interval on average, and a user's changes count by its
    mean rate: sum(n m I / 2) / sum(n m). None when there are no users.
    """
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
    """Group users into log-spaced buckets of (planning rate, mean rate, how many).

    About 9 % wide in the planning rate and 19 % in the mean rate: enough for the plan,
    and a few hundred buckets however many users.
    """
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
    """Per class of user (`RATE_CLASSES`): (class, users, mean interval in seconds,
    expected delay in seconds).

    `rates` as `bucket_rates` gives them; the interval is the steady one the plan gives
    (`interval_for`), averaged over the class's users; the expected delay is
    `expected_delay` over the class's users (None when the class is not expected to
    change). Classes without users are left out.
    """
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
