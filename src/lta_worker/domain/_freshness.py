"""Freshness per request: when a user is read next, and whether its stats are read too (pure).

A read is due when the delay its changes accrued since the last read reaches the price of a
read (the square-root rule for a steady rate; Cho and Garcia-Molina, SIGMOD 2000); stats is
read only when latest-change moved, or at `stats_max_age`. docs/config.md, *Freshness*.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final, Literal

from lta_worker.domain._estimate import BINS, ChangeEstimate, changed, content_hash, observe, slices

ScheduleMode = Literal["fixed", "adaptive"]
StatsMode = Literal["always", "on_change"]

# Users are due at most this share of `max_interval` after a read: the rest is room for
# the queue of due users, so that nobody goes unread longer than `max_interval`.
CAP_SHARE: Final = 0.85
# Due times are found to within this many seconds.
RESOLUTION: Final = 5.0


@dataclass(frozen=True, slots=True)
class FreshnessConfig:
    """The knobs of the schedule: the `[poll]` settings of the same names (docs/config.md)."""

    schedule: ScheduleMode
    interval: timedelta
    max_interval: timedelta
    stats: StatsMode
    stats_max_age: timedelta
    rate_half_life: timedelta

    def __post_init__(self) -> None:
        if self.max_interval < self.interval:
            raise ValueError("max_interval must not be shorter than interval")


@dataclass(frozen=True, slots=True)
class SchedulePlan:
    """The budget's answer for one pass: I_i = scale / sqrt(rate_i), clamped.

    `scale` is in sqrt(seconds); 0 means the budget covers every user at `interval`.
    """

    scale: float = 0.0
    budget_per_hour: float | None = None
    # How much dearer a read is in each hour than on average (`day_shape`): users of a few
    # time zones wake together; without it their reads pile up in their mornings.
    shape: tuple[float, ...] = (1.0,) * BINS
    # The mean delay in seconds this plan expects (`expected_delay`); None: no active users,
    # or no plan (`fixed`).
    expected_delay_s: float | None = None
    # The population's belief over `GRID` (`population_prior`); None: `DEFAULT_PRIOR`.
    prior: tuple[float, ...] | None = None


def wants_stats(
    est: ChangeEstimate | None, latest_changed: bool, now: datetime, cfg: FreshnessConfig
) -> bool:
    """Whether this turn reads stats after latest-change answered: `always`; `on_change`, when
    its content changed (or was never seen), stats was never read or is `stats_max_age` old."""
    if cfg.stats == "always" or latest_changed or est is None or est.stats_at is None:
        return True
    return now - est.stats_at >= cfg.stats_max_age


def turn_cost(rate: float, interval: float, cfg: FreshnessConfig) -> float:
    """Expected reads of one turn: latest-change, and stats when it will be read."""
    if cfg.stats == "always":
        return 2.0
    p_change = -math.expm1(-rate * interval)
    p_age = min(1.0, interval / cfg.stats_max_age.total_seconds())
    return 1.0 + max(p_change, p_age)


def cap_seconds(cfg: FreshnessConfig) -> float:
    """The longest an adaptive schedule sets (`CAP_SHARE` of `max_interval`), in seconds."""
    return max(cfg.max_interval.total_seconds() * CAP_SHARE, cfg.interval.total_seconds())


def interval_for(rate: float, plan: SchedulePlan, cfg: FreshnessConfig) -> float:
    """The user's steady interval in seconds at a steady `rate`, within [interval,
    `cap_seconds`]: the I at which the delay accrued, rate I^2 / 2, reaches the price of a
    read, scale^2 / 2 times its `read_cost` (scale / sqrt(rate) at full cost)."""
    low, high = cfg.interval.total_seconds(), cap_seconds(cfg)
    if cfg.schedule == "fixed":
        return low
    if rate <= 0:
        return high
    age = cfg.stats_max_age.total_seconds()
    lo, hi = 0.0, high
    for _ in range(60):  # bisection
        mid = (lo + hi) / 2
        if rate * mid * mid >= plan.scale**2 * read_cost(rate * mid, mid >= age, cfg):
            hi = mid
        else:
            lo = mid
        if hi - lo < 1.0:
            break
    return float(min(max(hi, low), high))


def read_cost(expected: float, stats_due: bool, cfg: FreshnessConfig) -> float:
    """What one more read costs, as a share of a turn that reads both endpoints.

    `always`, or when stats will be read for its age anyway: 1. `on_change`: stats is read
    only when latest-change moved, with probability p = 1 - exp(-x) after x expected
    changes; lengthening the interval raises p, so the marginal cost of a turn,
    c - x dc/dx over 2 reads, is 1 - (1 + x) exp(-x) / 2: 1/2 for a user that rarely
    changes between reads, 1 for one that always does.
    """
    if cfg.stats == "always" or stats_due:
        return 1.0
    return 1.0 - 0.5 * (1.0 + expected) * math.exp(-expected)


def next_due(
    est: ChangeEstimate | None, now: datetime, plan: SchedulePlan, cfg: FreshnessConfig
) -> datetime:
    """When a user read successfully at `now` is due again (fixed: `now + interval`).

    Adaptive: when the delay its changes since `now` are expected to have waited, hour by
    hour of the estimated day, reaches the price of a read, (scale * shape)^2 / 2 times its
    `read_cost`; within [`interval`, `CAP_SHARE` of `max_interval`].
    """
    low, high = cfg.interval.total_seconds(), cap_seconds(cfg)
    if cfg.schedule == "fixed" or plan.scale <= 0:
        return now + timedelta(seconds=low)
    est = est or ChangeEstimate()
    rates = est.rates()
    stats_at = math.inf  # seconds from now until stats is due for its age
    if cfg.stats == "on_change":
        age = cfg.stats_max_age.total_seconds()
        stats_at = 0.0 if est.stats_at is None else (est.stats_at - now).total_seconds() + age
    waited = Waiting()
    for index, took in slices(now, high):
        price = (plan.scale * plan.shape[index]) ** 2 / 2
        found = waited.crossing(rates[index], took, price, stats_at, cfg)
        if found is not None:
            waited.spent += found
            break
        waited.advance(rates[index], took)
    return now + timedelta(seconds=min(max(waited.spent, low), high))


@dataclass(slots=True)
class Waiting:
    """What a user's changes since its last read have waited, walking forward in time:
    `accrued` change-seconds (the integral of `pending` changes) over `spent` seconds."""

    accrued: float = 0.0
    pending: float = 0.0
    spent: float = 0.0

    def short(
        self, rate: float, tau: float, price: float, stats_at: float, cfg: FreshnessConfig
    ) -> float:
        """How far the delay accrued `tau` seconds on (at `rate`) is above the read's price."""
        expected = self.pending + rate * tau
        delay = self.accrued + (self.pending + rate * tau / 2) * tau
        return delay - price * read_cost(expected, self.spent + tau >= stats_at, cfg)

    def crossing(
        self, rate: float, took: float, price: float, stats_at: float, cfg: FreshnessConfig
    ) -> float | None:
        """Seconds into an hour's `took` when the delay reaches the price, or None within them."""
        if self.short(rate, took, price, stats_at, cfg) < 0:
            return None
        low, high = 0.0, took
        while high - low > RESOLUTION:
            mid = (low + high) / 2
            if self.short(rate, mid, price, stats_at, cfg) >= 0:
                high = mid
            else:
                low = mid
        return high

    def advance(self, rate: float, took: float) -> None:
        """Move `took` seconds on at `rate`."""
        self.accrued += (self.pending + rate * took / 2) * took
        self.pending += rate * took
        self.spent += took


def fold_turn(
    est: ChangeEstimate | None,
    turn: Iterable[tuple[str, str, bytes]],
    now: datetime,
    cfg: FreshnessConfig,
    prior: tuple[float, ...] | None = None,
) -> ChangeEstimate | None:
    """The estimate after a turn's answers (endpoint, outcome kind, canonical content): only
    `ok` and `none` observe (latest-change's by `observe`, stats' marks `stats_at`)."""
    out = est
    for endpoint, kind, content in turn:
        if kind not in ("ok", "none"):
            continue
        if endpoint == "latest-change":
            out = observe(out or ChangeEstimate(), content_hash(kind, content), now, cfg, prior)
        elif endpoint == "stats":
            out = replace(out or ChangeEstimate(), stats_at=now)
    return out


def stats_still_wanted(
    est: ChangeEstimate | None,
    turn: Iterable[tuple[str, str, bytes]],
    now: datetime,
    cfg: FreshnessConfig,
) -> bool:
    """Whether stats is read after the turn so far (`wants_stats`); yes without a content answer."""
    for endpoint, kind, content in turn:
        if endpoint == "latest-change" and kind in ("ok", "none"):
            fresh = changed(est, content_hash(kind, content))
            return wants_stats(est, fresh, now, cfg)
    return True
