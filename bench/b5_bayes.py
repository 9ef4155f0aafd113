"""B5's learner told the population's model: how far learning from the bit alone can go.

The worker learns each user's day and level from one bit a read (did latest-change move?)
under a model that has to hold for any population: a user may change at night, change its
pace or move its hours, so its belief keeps a chance of starting over. This learner is told
`waking`'s model instead (bench/workloads.py): a user changes only in its waking hours, a
run of whole UTC hours (the zones make the first one any hour; as many hours as its length
covers, 13 to 17), at a steady rate an hour drawn from the classes' mixture, and none of
it ever changes. Its belief over (first hour, hours awake, rate) is Bayes' rule, exact on
that grid, over the very reads the worker made (`ModelTold.saw`), and the worker's rule
schedules on it (`b5_freshness.worker(teller=)`, `b5_told`). Its mean delay over the known-rate
oracle's is what estimates learned from the bit could reach on `waking` under the worker's
rule (bench/README.md, B5); it knows no user's own truth, only the population's model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

import numpy as np
import numpy.typing as npt

from bench.b5_told import IDLE_RATE
from bench.workloads import WAKING_CLASSES, WAKING_LENGTH, WAKING_SPREAD
from lta_worker.domain import ChangeEstimate

Array = npt.NDArray[np.float64]

FIRST = np.arange(24.0)  # first waking hour, UTC
AWAKE = np.arange(math.floor(WAKING_LENGTH[0]), math.floor(WAKING_LENGTH[1]) + 1.0)
# Rate an hour while awake: none (idle), else a log grid wide enough for every class.
RATES = np.concatenate([[0.0], np.geomspace(1e-3, 20.0, 48)])
_START, _HOURS = np.repeat(FIRST, len(AWAKE)), np.tile(AWAKE, len(FIRST))


def _awake_prior() -> Array:
    """P(hours awake): a length L in WAKING_LENGTH from a uniformly placed start covers
    floor(L) whole hours, or one more with chance frac(L)."""
    weights = np.zeros(len(AWAKE))
    for length in np.linspace(*WAKING_LENGTH, 4001)[:-1] + 0.5e-3:
        k = int(length) - int(AWAKE[0])
        weights[k] += 1 - length % 1
        weights[min(k + 1, len(AWAKE) - 1)] += length % 1
    out: Array = weights / weights.sum()
    return out


def _rate_prior() -> Array:
    """P(rate an hour): the classes' mixture of log-normal daily rates, spread over the
    waking hours' lengths (idle users at rate 0)."""
    weights, logs = np.zeros(len(RATES)), np.log(RATES[1:])
    lengths = np.linspace(*WAKING_LENGTH, 9)
    for _, share, median in WAKING_CLASSES:
        if not median:
            weights[0] += share
            continue
        for length in lengths:
            dens = np.exp(-0.5 * ((logs - math.log(median / length)) / WAKING_SPREAD) ** 2)
            weights[1:] += share / len(lengths) * dens / dens.sum()
    out: Array = weights / weights.sum()
    return out


PRIOR: Array = (np.tile(_awake_prior(), len(FIRST)) / len(FIRST))[:, None] * _rate_prior()


def awake_by(t: float | Array) -> Array:
    """Hours awake in [0, t) (hours since the epoch, UTC) per (first hour, hours awake)."""
    since = np.asarray(t) - _START
    out: Array = _HOURS * np.floor(since / 24) + np.minimum(np.mod(since, 24), _HOURS)
    return out


# Per hour of the day, how much of it each window is awake (0 or 1: whole hours).
_AWAKE_IN: Array = np.stack([awake_by(h + 1.0) - awake_by(float(h)) for h in range(24)])


class ModelTold:
    """Each user's belief under the model, fed the bits the worker saw."""

    def __init__(self, users: int) -> None:
        self._belief = np.repeat(PRIOR[None], users, axis=0)
        self._hourly: list[Array | None] = [None] * users

    def saw(self, i: int, before: ChangeEstimate | None, after: ChangeEstimate | None) -> None:
        """Fold user `i`'s read into its belief: from the read before (`before.seen_at`) to
        this one, latest-change moved or not (the worker's content hashes say)."""
        if before is None or before.seen_at is None or after is None or after.seen_at is None:
            return
        awake = awake_by(_hours(after.seen_at)) - awake_by(_hours(before.seen_at))
        expected = awake[:, None] * RATES[None, :]
        moved = after.content != before.content
        belief = self._belief[i] * (-np.expm1(-expected) if moved else np.exp(-expected))
        total = belief.sum()
        if total > 0:  # else a read the model cannot explain: keep what it believed
            self._belief[i] = belief / total
            self._hourly[i] = None

    def hourly(self, i: int) -> Array:
        """User `i`'s expected changes an hour, by hour of the day (UTC)."""
        hourly = self._hourly[i]
        if hourly is None:
            hourly = self._hourly[i] = _AWAKE_IN @ (self._belief[i] @ RATES)
        return hourly

    def rates(self, i: int, est: ChangeEstimate | None, t: float) -> Sequence[float]:
        """`b5_told.Teller`: changes a second by hour of the day (the estimate unused)."""
        return [max(float(r) / 3600, IDLE_RATE) for r in self.hourly(i)]

    def per_day(self, i: int) -> float:
        """User `i`'s expected changes a day."""
        return float(self.hourly(i).sum())


def _hours(at: datetime) -> float:
    return at.timestamp() / 3600
