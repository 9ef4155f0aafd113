"""B5's learner told the population's model: how far learning from the bit alone can go.

The worker learns each user's day and level from one bit a read (did latest-change move?)
under a model that has to hold for any population: a user may change at night, change its
pace or move its hours, so its belief keeps a chance of starting over. This learner is told
the model the population was drawn from instead (bench/workloads.py), not any user's truth:
`waking_model`, a user changes only in its waking hours, a run of whole UTC hours (the
zones make the first one any hour; as many hours as its length covers, 13 to 17), at a
steady rate an hour from the classes' mixture; `builtin_model`, the same in one of eight
time zones' 07-23, and at the run's half-way mark each user's rate moves once, as the
classes' chances say. Its belief over (window, rate) is Bayes' rule, exact on that grid,
over the very reads the worker made (`ModelTold.saw`), and the worker's rule schedules on
it (`b5_freshness.worker(teller=)`, `b5_told`). Its mean delay over the known-rate oracle's
is what estimates learned from the bit could reach under the worker's rule (bench/README.md,
B5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

import numpy as np
import numpy.typing as npt

from bench import workloads as w
from bench.b5_told import IDLE_RATE
from lta_worker.domain import ChangeEstimate

Array = npt.NDArray[np.float64]

# Rate an hour while awake: none (idle), else a log grid wide enough for every class.
RATES = np.concatenate([[0.0], np.geomspace(1e-3, 20.0, 48)])


@dataclass(frozen=True)
class Model:
    """What the learner is told: `awake` (24 x windows), how much of each hour of the day
    (UTC) each window is awake; `prior` (windows x RATES); and, for a population whose rates
    move once, when (`moves_at`, hours since the epoch) and how (`kernel`, RATES x RATES)."""

    awake: Array
    prior: Array
    moves_at: float | None = None
    kernel: Array | None = None

    @cached_property
    def _by_hour(self) -> Array:
        """Hours awake from midnight to each hour of the day, 0 to 24 (25 x windows)."""
        out: Array = np.concatenate([np.zeros((1, self.awake.shape[1])), self.awake.cumsum(0)])
        return out

    def awake_by(self, t: float) -> Array:
        """Hours awake in [0, t) (hours since the epoch, UTC), per window."""
        days, into = divmod(t, 24.0)
        hour, by_hour = int(into), self._by_hour
        out: Array = days * by_hour[24] + by_hour[hour] + (into - hour) * self.awake[hour]
        return out


def _log_normal(median: float, sigma: float, per: float) -> Array:
    """A log-normal of changes a day about `median`, over RATES (an hour: a day / `per`)."""
    logs = np.log(RATES[1:] * per)
    dens = np.exp(-0.5 * ((logs - math.log(median)) / sigma) ** 2)
    out: Array = np.concatenate([[0.0], dens / dens.sum()])
    return out


def waking_model() -> Model:
    """`workloads.waking`'s: any first hour, 13-17 hours awake, steady rates."""
    low, high = w.WAKING_LENGTH
    counts = np.arange(math.floor(low), math.floor(high) + 1)
    chance = np.zeros(len(counts))  # a length L placed anywhere covers floor(L) hours, or one more
    for length in np.linspace(low, high, 4001)[:-1] + 0.5e-3:
        k = int(length) - int(counts[0])
        chance[k] += 1 - length % 1
        chance[min(k + 1, len(counts) - 1)] += length % 1
    windows = [(first, n) for first in range(24) for n in counts]
    awake = np.array([[float((h - f) % 24 < n) for f, n in windows] for h in range(24)])
    rates, lengths = np.zeros(len(RATES)), np.linspace(low, high, 9)
    for _, share, median in w.WAKING_CLASSES:
        if not median:
            rates[0] += share
            continue
        for length in lengths:
            rates += share / len(lengths) * _log_normal(median, w.WAKING_SPREAD, length)
    per_window = np.tile(chance / chance.sum(), 24) / 24
    return Model(awake, per_window[:, None] * rates)


def builtin_model(moves_at: datetime) -> Model:
    """`workloads.builtin`'s: one of eight zones' 07-23, then every rate moves once."""
    awake = np.array(
        [[float(w.WAKING[0] <= (h + z) % 24 < w.WAKING[1]) for z in w.ZONES] for h in range(24)]
    )
    per = w.WAKING[1] - w.WAKING[0]
    idle = (RATES == 0).astype(float)
    ordinary, heavy = _log_normal(*w.ORDINARY, per), _log_normal(*w.HEAVY, per)
    heavy_share = 1 - w.IDLE_SHARE - w.ORDINARY_SHARE
    rates = w.IDLE_SHARE * idle + w.ORDINARY_SHARE * ordinary + heavy_share * heavy
    kernel = np.zeros((len(RATES), len(RATES)))
    for k, rate in enumerate(RATES * per):
        if rate == 0:
            stay, move = 1 - w.WAKE, w.WAKE * ordinary
        elif rate < w.HEAVY_FROM:
            stay, move = 1 - w.QUIET - w.BUSIER, w.QUIET * idle + w.BUSIER * heavy
        else:
            stay, move = 1 - w.CALM, w.CALM * ordinary
        kernel[k] = move
        kernel[k, k] += stay
    prior = np.full(len(w.ZONES), 1 / len(w.ZONES))[:, None] * rates
    return Model(awake, prior, _hours(moves_at), kernel)


class ModelTold:
    """Each user's belief under `model`, fed the bits the worker saw."""

    def __init__(self, users: int, model: Model) -> None:
        self.model = model
        self._belief = np.repeat(model.prior[None], users, axis=0)
        self._hourly: list[Array | None] = [None] * users

    def saw(self, i: int, before: ChangeEstimate | None, after: ChangeEstimate | None) -> None:
        """Fold user `i`'s read into its belief: from the read before (`before.seen_at`) to
        this one, latest-change moved or not (the worker's content hashes say); a read
        across the moment rates move weighs each rate before against each after."""
        if before is None or before.seen_at is None or after is None or after.seen_at is None:
            return
        m, a, b = self.model, _hours(before.seen_at), _hours(after.seen_at)
        moved = after.content != before.content
        belief = self._belief[i]
        if m.moves_at is not None and m.kernel is not None and a < m.moves_at <= b:
            first = (m.awake_by(m.moves_at) - m.awake_by(a))[:, None] * RATES
            then = (m.awake_by(b) - m.awake_by(m.moves_at))[:, None] * RATES
            expected = first[:, :, None] + then[:, None, :]
            joint = belief[:, :, None] * m.kernel[None] * _likelihood(expected, moved)
            belief = joint.sum(axis=1)
        else:
            expected = (m.awake_by(b) - m.awake_by(a))[:, None] * RATES
            belief = belief * _likelihood(expected, moved)
        total = belief.sum()
        if total > 0:  # else a read the model cannot explain: keep what it believed
            self._belief[i] = belief / total
            self._hourly[i] = None

    def hourly(self, i: int) -> Array:
        """User `i`'s expected changes an hour, by hour of the day (UTC)."""
        hourly = self._hourly[i]
        if hourly is None:
            hourly = self._hourly[i] = self.model.awake @ (self._belief[i] @ RATES)
        return hourly

    def rates(self, i: int, est: ChangeEstimate | None, t: float) -> Sequence[float]:
        """`b5_told.Teller`: changes a second by hour of the day (the estimate unused)."""
        return [max(float(r) / 3600, IDLE_RATE) for r in self.hourly(i)]

    def per_day(self, i: int) -> float:
        """User `i`'s expected changes a day."""
        return float(self.hourly(i).sum())


def _likelihood(expected: Array, moved: bool) -> Array:
    """Of a read that saw a change (1 - e^-x) or none (e^-x), x changes expected."""
    out: Array = -np.expm1(-expected) if moved else np.exp(-expected)
    return out


def _hours(at: datetime) -> float:
    return at.timestamp() / 3600
