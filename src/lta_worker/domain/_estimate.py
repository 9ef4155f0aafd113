"""What the reads of one user observed of its changes: the estimate and how it learns.

Pure; no I/O, every function takes `now`. After Cho and Garcia-Molina ("Estimating
frequency of change", TOIT 2003): a read only tells whether latest-change's content
differs from the stored one (its content hash), not how many changes happened in between.
`observe` folds each such observation into two things. The day's shape: a decayed count of
changes and of time observed per slice of the day in UTC (an EM step for interval-censored
Poisson changes: a changed read over an interval counts Lambda / (1 - exp(-Lambda))
expected changes, Lambda the changes the estimate expected, so at least one), so that a
user who changes only in its own waking hours, whatever its time zone, is read then. The
level, the mean rate: a belief over a log grid of rates (`GRID`, 41 numbers), updated by
Bayes' rule with each read's likelihood (1 - exp(-rate span) for a change seen,
exp(-rate span) for none). Its prior is the population's (`_spread.population_prior`, the
mean of the users' beliefs: empirical Bayes), so a busy user whose every read sees a
change is pulled towards the rates the population has, not to a fixed one change a day.
A user may start over at any time (`update_belief`: a hidden Markov model that
returns to the population's prior at the pace of `rate_half_life`), so a user who wakes
after days idle, or turns busy or quiet, is relearned within a read or two of the change:
its old reads weigh only as long as they keep explaining the new ones.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from lta_worker.domain._freshness import FreshnessConfig

HOUR: Final = 3600.0
BINS: Final = 6
BIN_SECONDS: Final = 24 * HOUR / BINS
# The day's shape's prior: as if a quarter change had been seen over six hours (one a day)
# in every slice, so that a slice without reads keeps the mean's share.
PRIOR_CHANGES: Final = 0.25
PRIOR_SECONDS: Final = 6 * HOUR
# Reads go as rate**EXPONENT: 1/2 is the square-root rule (B5: 0.6 and 0.7 do worse).
EXPONENT: Final = 0.5
# No rate above one change a minute is believed (keeps the EM step finite when every
# read saw a change).
MAX_RATE: Final = 1 / 60.0
# The level's belief: a probability per rate of a log grid, 0.01 to 1000 changes a day.
GRID_SIZE: Final = 41
GRID: Final = tuple(0.01 / 86400 * 10 ** (7 * k / (GRID_SIZE - 1)) for k in range(GRID_SIZE))


def _default_prior() -> tuple[float, ...]:
    """Before the population says otherwise: log-normal about one change a day, wide."""
    weights = [math.exp(-0.5 * (math.log(g * 86400) / 2.0) ** 2) for g in GRID]
    total = sum(weights)
    return tuple(w / total for w in weights)


DEFAULT_PRIOR: Final = _default_prior()


@dataclass(frozen=True, slots=True)
class ChangeEstimate:
    """What the reads of one user have observed, stored with the user.

    The day is cut into `BINS` slices of UTC time, so that a user who changes only in
    their own waking hours (whatever their time zone) is read then, not at night.

    Attributes:
        changes: Decayed expected number of changes seen, per slice of the day.
        observed: Decayed seconds of observation, per slice of the day.
        content: The content hash of the last latest-change answer (None: never read).
        seen_at: When that answer was read.
        stats_at: When stats was last read successfully.
        level: The estimated mean rate, the mean of `belief`; None before any interval was
            read.
        belief: The probability of each rate of `GRID` being the user's (`update_belief`);
            None before any interval was read (then the population's prior).
    """

    changes: tuple[float, ...] = (0.0,) * BINS
    observed: tuple[float, ...] = (0.0,) * BINS
    content: str | None = None
    seen_at: datetime | None = None
    stats_at: datetime | None = None
    level: float | None = None
    belief: tuple[float, ...] | None = None

    def rates(self) -> tuple[float, ...]:
        """Estimated changes per second in each slice of the day (the prior until reads say
        otherwise): the day's shape from the counts per slice, scaled to `level`."""
        shape = self.shape_rates()
        if self.level is None:
            return shape
        mean = sum(shape) / BINS
        return tuple(min(self.level * r / mean, MAX_RATE) for r in shape)

    def shape_rates(self) -> tuple[float, ...]:
        """Changes per second per slice from the counts per slice alone (the EM step's)."""
        prior_c, prior_s = PRIOR_CHANGES / BINS, PRIOR_SECONDS / BINS
        return tuple(
            min((c + prior_c) / (o + prior_s), MAX_RATE)
            for c, o in zip(self.changes, self.observed, strict=True)
        )

    def rate(self) -> float:
        """The rate the budget plans with: (mean of sqrt(rate) over the day) squared.

        A user read at intensity sqrt(rate(t)) costs this many reads as one read at a
        steady `scale / sqrt(rate)` interval would.
        """
        return float((sum(r**EXPONENT for r in self.rates()) / BINS) ** (1 / EXPONENT))

    def to_json(self) -> dict[str, Any]:
        """The estimate as stored (JSON: floats rounded, times as ISO strings)."""
        return {
            "c": [round(c, 4) for c in self.changes],
            "o": [round(o, 1) for o in self.observed],
            "h": self.content,
            "s": self.seen_at.isoformat() if self.seen_at else None,
            "t": self.stats_at.isoformat() if self.stats_at else None,
            "l": self.level,
            "b": None if self.belief is None else [float(f"{b:.4g}") for b in self.belief],
        }

    @classmethod
    def from_json(cls, raw: Any) -> ChangeEstimate | None:
        """The estimate back from `to_json`; None for anything else (a fresh start)."""
        try:
            changes = tuple(float(c) for c in raw["c"])
            observed = tuple(float(o) for o in raw["o"])
            if len(changes) != BINS or len(observed) != BINS:
                return None
            belief = _stored_belief(raw, changes, observed)
            level = None if belief is None else _mean(belief)
            return cls(
                belief=belief,
                changes=changes,
                observed=observed,
                content=str(raw["h"]) if raw.get("h") is not None else None,
                seen_at=_stamp(raw.get("s")),
                stats_at=_stamp(raw.get("t")),
                level=level,
            )
        except (TypeError, KeyError, ValueError, AttributeError):
            return None

    def buckets(self) -> tuple[int, int]:
        """(planning rate, mean rate) on the log scales `bucket_rates` groups by."""
        return (round(8 * math.log2(self.rate())), round(4 * math.log2(self.mean_rate())))

    def mean_rate(self) -> float:
        """Estimated changes per second, on average over the day."""
        return sum(self.rates()) / BINS

    def per_day(self) -> float:
        """Estimated changes per day."""
        return self.mean_rate() * 24 * HOUR


def content_hash(status: str, content: bytes) -> str:
    """A short hash of an answer's content: its status and the payload's canonical JSON."""
    return hashlib.sha256(status.encode() + b":" + content).hexdigest()[:32]


def _mean(belief: Sequence[float]) -> float:
    """The mean rate a belief over `GRID` gives."""
    return sum(b * g for b, g in zip(belief, GRID, strict=True))


def _stored_belief(
    raw: Any, changes: Sequence[float], observed: Sequence[float]
) -> tuple[float, ...] | None:
    """The belief as stored (`b`); from an older version's evidence when there is none.

    Before the belief, the level's evidence was `m` (reads that saw a change, by the step
    of their length: 60 s x 2^(k/2)) and `q` (seconds of reads that saw none); before the
    level, only the counts per slice. Either is the likelihood of the same reads, here
    folded into the default prior: an upgrade keeps what every user's reads said.
    """
    stored = raw.get("b")
    if stored is not None:
        belief = tuple(float(b) for b in stored)
        if len(belief) != GRID_SIZE or any(not b >= 0 for b in belief) or sum(belief) <= 0:
            raise ValueError("belief")
        return tuple(b / sum(belief) for b in belief)
    if raw.get("l") is not None:
        moved = {60.0 * 2 ** (int(k) / 2): float(m) for k, m in (raw.get("m") or {}).items()}
        quiet = float(raw.get("q") or 0.0)
    else:
        moved, quiet = {60.0: sum(changes)}, sum(observed)
    if quiet <= 0 and not any(moved.values()):
        return None
    logs = [
        math.log(p)
        - g * quiet
        + sum(m * math.log(-math.expm1(-g * t)) for t, m in moved.items() if m > 0)
        for p, g in zip(DEFAULT_PRIOR, GRID, strict=True)
    ]
    top = max(logs)
    weights = [math.exp(x - top) for x in logs]
    return tuple(w / sum(weights) for w in weights)


def _stamp(value: Any) -> datetime | None:
    if value is None:
        return None
    stamp = datetime.fromisoformat(str(value))
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def slices(start: datetime, seconds: float) -> list[tuple[int, float]]:
    """(slice of the day, seconds) covered by [start, start + seconds)."""
    out: list[tuple[int, float]] = []
    at = start.timestamp()
    left = seconds
    while left > 0:
        index = int(at // BIN_SECONDS)
        take = min(left, (index + 1) * BIN_SECONDS - at)
        out.append((index % BINS, take))
        at += take
        left -= take
    return out


def observe(
    est: ChangeEstimate,
    content: str,
    now: datetime,
    cfg: FreshnessConfig,
    prior: Sequence[float] | None = None,
) -> ChangeEstimate:
    """Fold one latest-change read (its content hash) into the estimate.

    Two parts. The day's shape: the interval since the previous read is observed time,
    shared out over the slices of the day it covered; a change seen counts lambda / (1 -
    exp(-lambda)) expected changes (lambda: the changes the shape expected, so at least
    one), shared over the slices in proportion to what each expected. The level (`level`,
    changes per second over the day): the mean of the belief over `GRID` after the read
    (`update_belief`, `prior` the population's, `DEFAULT_PRIOR` without one), the
    interval measured at the shape's mean rate. The EM step alone learns a busy user's
    rate slowly: when almost every read sees a change, each adds barely more than the
    estimate already expected; the belief weighs the reads that saw none, which say how
    busy it really is, and the population, which says how busy users are.
    """
    if est.content is None or est.seen_at is None:
        return replace(est, content=content, seen_at=now)
    seconds = (now - est.seen_at).total_seconds()
    if seconds <= 0:
        return replace(est, content=content, seen_at=now)
    decay = 0.5 ** (seconds / cfg.rate_half_life.total_seconds())
    changes = [c * decay for c in est.changes]
    observed = [o * decay for o in est.observed]
    rates = est.shape_rates()
    mean = sum(rates) / BINS
    parts = slices(est.seen_at, seconds)
    for index, took in parts:
        observed[index] += took
    weights = [(index, rates[index] * took) for index, took in parts]
    expected = sum(w for _, w in weights)
    span = expected / mean  # the interval in seconds at the mean rate
    moved = content != est.content
    if moved:
        total = expected / -math.expm1(-expected) if expected > 1e-9 else 1.0
        for index, weight in weights:
            changes[index] += total * weight / expected if expected > 1e-9 else total / len(parts)
    belief = update_belief(
        est.belief, moved, span=span, seconds=seconds, cfg=cfg, prior=prior or DEFAULT_PRIOR
    )
    return ChangeEstimate(
        changes=tuple(changes),
        observed=tuple(observed),
        content=content,
        seen_at=now,
        stats_at=est.stats_at,
        level=_mean(belief),
        belief=belief,
    )


def update_belief(
    belief: Sequence[float] | None,
    moved: bool,
    *,
    span: float,
    seconds: float,
    cfg: FreshnessConfig,
    prior: Sequence[float],
) -> tuple[float, ...]:
    """The belief over `GRID` after a read over `span` seconds (at the mean rate) that saw
    a change or not, `seconds` after the last: a forward step of a hidden Markov model
    whose user may at any time start over with a rate drawn from `prior` (with
    probability 1 - 2^(-seconds / rate_half_life)), then Bayes' rule with the read's
    likelihood, 1 - exp(-rate span) for a change seen, exp(-rate span) for none."""
    half = cfg.rate_half_life.total_seconds()
    start = -math.expm1(-seconds * math.log(2) / half)
    old = prior if belief is None else belief
    out = []
    for b, p, g in zip(old, prior, GRID, strict=True):
        x = g * span
        like = -math.expm1(-x) if moved else math.exp(-x)
        out.append(((1 - start) * b + start * p) * like)
    total = sum(out)
    if total <= 0:
        return tuple(prior)
    return tuple(w / total for w in out)


def changed(est: ChangeEstimate | None, content: str) -> bool:
    """True when latest-change's content differs from the last one seen (or none was)."""
    return est is None or est.content != content
