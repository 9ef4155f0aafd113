"""B5's yardsticks: round robin (both endpoints, or stats only on change) and a known-rate oracle.

Pure functions on virtual time in hours: they take the users' changes (and, for the oracle,
their true hourly change intensity), the reads an hour and the run's end, and return when
each user's turns arrived. One read per slot at an even pace (what the pacer does); a turn
reads latest-change, then stats when wanted, and its data arrive with its last read.

The oracle is the policy the worker is measured against: at each read slot it reads the user
whose expected accrued delay per read cost is largest, computed from the true intensity.
A user last read at `r` has accrued, by `t`, an expected delay of the integral of
`lambda(s) (t - s)` over `[r, t]` (each change since `r` has waited `t - s`), and a read
costs one slot for latest-change plus one for stats when it changed (probability
`1 - exp(-N)`, N the expected changes since `r`) or when stats are `stats_max_age` old
(then two). With the intensity constant within each hour, both are closed forms. It keeps
the worker's limits: a user whose last read is nearly `max_interval` old (within
`CAP_MARGIN_H` or four slots) is read first.
Like the worker, it starts with a sweep that reads every user once, in order.
When no user has accrued anything (everyone quiet since their last read), it reads the
user read longest ago.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# How long before `max_interval` (or four slots, if longer) the oracle reads a user whatever
# its index (hours): a turn takes up to two slots, and several users can come due together.
CAP_MARGIN_H = 0.25


@dataclass
class Schedule:
    """What a policy read: per user the arrival times of its turns and of its stats reads.

    Attributes:
        turns: For each user, when each of its turns arrived (hours, increasing).
        stats: For each user, when its stats were read.
        reads: Reads made in all (a turn is one or two).
        per_user_reads: For each user, the reads made of it.
        estimates: The worker's: each user's estimated changes a day at the end.
        dues: The worker's: for each user, the due time each of its turns set.
    """

    turns: list[list[float]]
    stats: list[list[float]]
    reads: int = 0
    per_user_reads: list[int] = field(default_factory=list)
    estimates: list[float] = field(default_factory=list)
    dues: list[list[float]] = field(default_factory=list)


def _empty(n: int) -> Schedule:
    return Schedule([[] for _ in range(n)], [[] for _ in range(n)], 0, [0] * n)


def _changed(changes: Sequence[float], after: float, until: float) -> bool:
    """Whether a change happened in `(after, until]`."""
    k = bisect.bisect_right(changes, after)
    return k < len(changes) and changes[k] <= until


def _turn(out: Schedule, changes: Sequence[float], i: int, t: float, state: _Reads) -> float:
    """User `i`'s turn from `t`: latest-change, then stats when it changed or when due.

    Returns:
        When the turn's data arrived (its last read).
    """
    changed = _changed(changes, state.last[i], t) if state.last[i] > -math.inf else True
    state.last[i] = t
    reads = 1
    if changed or t >= state.stats_due[i]:
        t += state.slot
        state.stats_due[i] = t + state.stats_max_age
        out.stats[i].append(t)
        reads = 2
    out.turns[i].append(t)
    out.reads += reads
    out.per_user_reads[i] += reads
    return t


@dataclass
class _Reads:
    """What a policy knows of its reads: latest-change's last read, when stats are due."""

    last: list[float]
    stats_due: list[float]
    stats_max_age: float
    slot: float

    @classmethod
    def start(cls, n: int, stats_max_age: float, per_hour: float) -> _Reads:
        return cls([-math.inf] * n, [0.0] * n, stats_max_age, 1.0 / per_hour)


def round_robin(n: int, per_hour: float, end: float) -> Schedule:
    """Every user in turn, both endpoints each turn: what the peers do.

    Args:
        n: Users.
        per_hour: Reads an hour.
        end: The run's end (hours).
    """
    out, slot, t, i = _empty(n), 1.0 / per_hour, 0.0, 0
    while t + slot < end:
        t += slot  # stats, the turn's second read; latest-change was the slot before
        out.turns[i].append(t)
        out.stats[i].append(t)
        out.reads += 2
        out.per_user_reads[i] += 2
        t += slot
        i = (i + 1) % n
    return out


def round_robin_on_change(
    changes: Sequence[Sequence[float]],
    per_hour: float,
    end: float,
    stats_max_age: float,
    enrolled: Sequence[float] | None = None,
) -> Schedule:
    """Every user in turn; stats only when latest-change changed or stats are too old.

    Args:
        changes: Each user's change times (hours, sorted).
        per_hour: Reads an hour.
        end: The run's end (hours).
        stats_max_age: Hours after which stats are read whatever latest-change says.
        enrolled: When each user was enrolled (hours; None: all at 0): until then its turn
            is passed over, at no cost.
    """
    n = len(changes)
    out, slot, t, i = _empty(n), 1.0 / per_hour, 0.0, 0
    state = _Reads.start(n, stats_max_age, per_hour)
    joined = enrolled or [0.0] * n
    passed = 0  # turns passed over in a row
    while t < end:
        if joined[i] <= t:
            t, passed = _turn(out, changes[i], i, t, state) + slot, 0
        elif (passed := passed + 1) >= n:  # nobody enrolled yet
            t, passed = min(j for j in joined if j > t), 0
        i = (i + 1) % n
    return out


def accrued_delay(intensity: Sequence[float], since: float, now: float) -> float:
    """Expected delay accrued by `now` by the changes after `since` (a reference, for tests).

    Args:
        intensity: Changes per hour, hour by hour from 0.
        since: The last read (hours).
        now: The time of the next read (hours).
    """
    total, t = 0.0, since
    while t < now:
        h = int(t)
        nxt = min(now, h + 1.0)
        lam = intensity[min(h, len(intensity) - 1)]
        # Integral of lam (now - s) ds over [t, nxt].
        total += lam * ((now - t) ** 2 - (now - nxt) ** 2) / 2
        t = nxt
    return total


def _rates(row: Sequence[float], base: int, hours: int) -> list[float]:
    """A user's true rates for the `hours` hours from hour `base` (the last hour repeated)."""
    return [row[min(h, len(row) - 1)] for h in range(base, base + hours)]


@dataclass
class _Known:
    """A user's rates from hour `base` on, as known after its last read, and their running
    integrals at each hour mark from `base`: L (of lambda) and M (of s lambda(s))."""

    base: int
    rates: list[float]
    cum_l: list[float]
    cum_m: list[float]

    @classmethod
    def of(cls, base: int, rates: list[float]) -> _Known:
        lc, mc, acc_l, acc_m = [0.0], [0.0], 0.0, 0.0
        for k, lam in enumerate(rates):
            acc_l += lam
            acc_m += lam * (base + k + 0.5)
            lc.append(acc_l)
            mc.append(acc_m)
        return cls(base, rates, lc, mc)

    def hour(self, h: int) -> tuple[float, float, float]:
        """(L, M at the mark of hour h, the rate in hour h), within what is known."""
        k = min(max(h - self.base, 0), len(self.rates) - 1)
        return self.cum_l[k], self.cum_m[k], self.rates[k]

    def at(self, t: float) -> tuple[float, float]:
        """(L, M) at time t."""
        h = min(max(int(t), self.base), self.base + len(self.rates) - 1)
        l0, m0, lam = self.hour(h)
        return l0 + lam * (t - h), m0 + lam * (t * t - h * h) / 2


def oracle(
    changes: Sequence[Sequence[float]],
    intensity: Sequence[Sequence[float]],
    per_hour: float,
    end: float,
    *,
    max_interval: float,
    stats_max_age: float,
) -> Schedule:
    """The oracle: each slot, the user with the largest expected delay per read cost.

    Args:
        changes: Each user's change times (hours, sorted): what its reads see.
        intensity: Each user's true change rate, changes per hour, hour by hour from 0
            (at least `ceil(end)` values).
        per_hour: Reads an hour.
        end: The run's end (hours).
        max_interval: Hours after which a user is read whatever its index.
        stats_max_age: Hours after which stats are read whatever latest-change says.
    """
    n = len(changes)
    out, slot = _empty(n), 1.0 / per_hour
    width = math.ceil(max_interval) + 4  # hours ahead of a read its rates are known for
    known = [_Known.of(0, _rates(intensity[i], 0, width)) for i in range(n)]
    read_at = [0.0] * n  # the last arrival: the reference of the accrued delay
    lr, mr = [0.0] * n, [0.0] * n  # L and M at read_at
    state = _Reads.start(n, stats_max_age, per_hour)
    stats_due = state.stats_due
    oldest = [(0.0, i) for i in range(n)]  # (read_at, user), stale entries skipped
    lam, n0, a0 = [0.0] * n, [0.0] * n, [0.0] * n
    hour = -1

    def rebase(i: int) -> None:
        # Within the hour [H, H+1), with u = t - H: N = n0 + lam u, A = a0 + n0 u + lam u^2 / 2.
        cum_l, cum_m, lam[i] = known[i].hour(hour)
        n0[i] = cum_l - lr[i]
        a0[i] = hour * n0[i] - (cum_m - mr[i])

    t, cap, sweep = 0.0, max_interval - max(CAP_MARGIN_H, 4 * slot), 0
    exp = math.exp
    while t < end:
        if int(t) != hour:
            hour = int(t)
            for i in range(n):
                rebase(i)
        while oldest[0][0] != read_at[oldest[0][1]]:
            heapq.heappop(oldest)
        pick = oldest[0][1]
        if sweep < n:  # the first sweep, as the worker's (everyone is due at the start)
            pick, sweep = sweep, sweep + 1
        elif t - read_at[pick] < cap:
            u = t - hour
            index = [
                (a + u * (m + 0.5 * k * u)) / (2.0 if t >= s else 2.0 - exp(-(m + k * u)))
                for a, m, k, s in zip(a0, n0, lam, stats_due, strict=True)
            ]
            best = max(index)
            if best > 1e-12:
                pick = index.index(best)
        t = _turn(out, changes[pick], pick, t, state)
        read_at[pick] = t
        known[pick] = _Known.of(int(t), _rates(intensity[pick], int(t), width))
        lr[pick], mr[pick] = known[pick].at(t)
        heapq.heappush(oldest, (t, pick))
        rebase(pick)
        t += slot
    return out
