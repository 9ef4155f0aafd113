"""What the reads of one user observed of its changes: the estimate and how it learns.

Pure; no I/O, every function takes `now`. After Cho and Garcia-Molina ("Estimating
frequency of change", TOIT 2003): a read only tells whether latest-change's content
differs from the stored one (its content hash), not how many changes happened in between.
`observe` folds each such observation into two things. The day's shape: a decayed count of
changes and of time observed per slice of the day in UTC (an EM step for interval-censored
Poisson changes: a changed read over an interval counts Lambda / (1 - exp(-Lambda))
expected changes, Lambda the changes the estimate expected, so at least one), so that a
user who changes only in its own waking hours, whatever its time zone, is read then. The
level: the most probable mean rate given which reads saw a change and how long each was
(`solve_level`), which the EM step alone approaches only slowly for a busy user whose
every read sees a change. Old observations fade with `rate_half_life`, so a user who
turns idle, or busy, is followed within days.
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
# The prior: as if a quarter change had been seen over six hours (one a day), so a new
# user is read like an ordinary one until its own reads say otherwise. Its weight is fixed:
# the user's own evidence grows past it within days (only that evidence fades, with
# `rate_half_life`); a prior that fades as well measured no better (bench/README.md, B5).
PRIOR_CHANGES: Final = 0.25
PRIOR_SECONDS: Final = 6 * HOUR
# Reads go as rate**EXPONENT: 1/2 is the square-root rule (B5: 0.6 and 0.7 do worse).
EXPONENT: Final = 0.5
# No rate above one change a minute is believed (keeps the EM step finite when every
# read saw a change).
MAX_RATE: Final = 1 / 60.0
# The level's evidence: reads that saw a change, counted by how much they covered (in
# seconds at the user's mean rate), on a log scale of two steps an octave from a minute.
SPANS: Final = 32
SPAN_BASE: Final = 60.0


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
        quiet: Decayed seconds (at the mean rate) of the reads that saw no change.
        moved: Decayed reads that saw a change, per step of their length (`span_index`).
        level: The estimated mean rate (`solve_level`); None before any interval was read.
    """

    changes: tuple[float, ...] = (0.0,) * BINS
    observed: tuple[float, ...] = (0.0,) * BINS
    content: str | None = None
    seen_at: datetime | None = None
    stats_at: datetime | None = None
    quiet: float = 0.0
    moved: tuple[float, ...] = (0.0,) * SPANS
    level: float | None = None

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
            "q": round(self.quiet, 1),
            "m": {str(k): round(m, 4) for k, m in enumerate(self.moved) if m >= 5e-5},
            "l": self.level,
        }

    @classmethod
    def from_json(cls, raw: Any) -> ChangeEstimate | None:
        """The estimate back from `to_json`; None for anything else (a fresh start)."""
        try:
            changes = tuple(float(c) for c in raw["c"])
            observed = tuple(float(o) for o in raw["o"])
            if len(changes) != BINS or len(observed) != BINS:
                return None
            quiet, level = float(raw.get("q") or 0.0), raw.get("l")
            steps = {int(k): float(m) for k, m in (raw.get("m") or {}).items()}
            moved = tuple(steps.get(k, 0.0) for k in range(SPANS))
            if level is None or not all(0 <= k < SPANS for k in steps):
                # Stored before the level: its evidence starts from the counts, as if
                # each change had been seen alone (the level then equals their mean).
                moved = (sum(changes),) + (0.0,) * (SPANS - 1)
                quiet = sum(observed)
                level = solve_level(moved, quiet) if quiet > 0 else None
            return cls(
                changes=changes,
                observed=observed,
                content=str(raw["h"]) if raw.get("h") is not None else None,
                seen_at=_stamp(raw.get("s")),
                stats_at=_stamp(raw.get("t")),
                quiet=quiet,
                moved=moved,
                level=None if level is None else float(level),
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
    est: ChangeEstimate, content: str, now: datetime, cfg: FreshnessConfig
) -> ChangeEstimate:
    """Fold one latest-change read (its content hash) into the estimate.

    Two parts. The day's shape: the interval since the previous read is observed time,
    shared out over the slices of the day it covered; a change seen counts lambda / (1 -
    exp(-lambda)) expected changes (lambda: the changes the shape expected, so at least
    one), shared over the slices in proportion to what each expected. The level (`level`,
    changes per second over the day): the maximum a posteriori rate of Poisson changes
    seen only as "changed or not" over each read's interval (`solve_level`), the interval
    measured at the shape's mean rate. The EM step alone learns a busy user's rate slowly:
    when almost every read sees a change, each adds barely more than the estimate already
    expected; the level counts the reads that saw none, which say how busy it really is.
    """
    if est.content is None or est.seen_at is None:
        return replace(est, content=content, seen_at=now)
    seconds = (now - est.seen_at).total_seconds()
    if seconds <= 0:
        return replace(est, content=content, seen_at=now)
    decay = 0.5 ** (seconds / cfg.rate_half_life.total_seconds())
    changes = [c * decay for c in est.changes]
    observed = [o * decay for o in est.observed]
    moved = [m * decay for m in est.moved]
    quiet = est.quiet * decay
    rates = est.shape_rates()
    mean = sum(rates) / BINS
    parts = slices(est.seen_at, seconds)
    for index, took in parts:
        observed[index] += took
    weights = [(index, rates[index] * took) for index, took in parts]
    expected = sum(w for _, w in weights)
    span = expected / mean  # the interval in seconds at the mean rate
    if content != est.content:
        total = expected / -math.expm1(-expected) if expected > 1e-9 else 1.0
        for index, weight in weights:
            changes[index] += total * weight / expected if expected > 1e-9 else total / len(parts)
        moved[span_index(span)] += 1.0
    else:
        quiet += span
    return ChangeEstimate(
        changes=tuple(changes),
        observed=tuple(observed),
        content=content,
        seen_at=now,
        stats_at=est.stats_at,
        quiet=quiet,
        moved=tuple(moved),
        level=solve_level(moved, quiet, est.level),
    )


def span_index(span: float) -> int:
    """The log-scale step of a read's interval (seconds at the mean rate) in `moved`."""
    if span <= SPAN_BASE:
        return 0
    return min(round(2 * math.log2(span / SPAN_BASE)), SPANS - 1)


def span_seconds(index: int) -> float:
    """The interval a step of `moved` stands for."""
    return float(SPAN_BASE * 2 ** (index / 2))


SPAN_SECONDS: Final = tuple(span_seconds(k) for k in range(SPANS))


def solve_level(moved: Sequence[float], quiet: float, guess: float | None = None) -> float:
    """The most probable mean rate given the reads: `moved[k]` reads that saw a change over
    `span_seconds(k)` each, `quiet` seconds of reads that saw none, and the prior (a gamma
    density peaking at PRIOR_CHANGES over PRIOR_SECONDS, one change a day).

    The root in lambda of sum_k moved_k t_k / (exp(lambda t_k) - 1) + PRIOR_CHANGES /
    lambda = quiet + PRIOR_SECONDS (Cho and Garcia-Molina's estimator for irregular reads
    without a modification date, with the prior). The left side is convex and falls as
    lambda grows: Newton's method from `guess` (the last level), kept within a bracket
    that bisection narrows when a step leaves it; a few steps per read.
    """
    terms = [(m, t) for m, t in zip(moved, SPAN_SECONDS, strict=True) if m > 0]
    target = quiet + PRIOR_SECONDS

    def excess(rate: float) -> tuple[float, float]:
        value, slope = PRIOR_CHANGES / rate - target, -PRIOR_CHANGES / rate**2
        for m, t in terms:
            if rate * t > 40:  # a read that long says nothing: exp(-40) of a change
                continue
            grown = math.expm1(rate * t)
            value += m * t / grown
            slope -= m * t * t * (grown + 1) / grown**2
        return value, slope

    low, high = 1e-12, MAX_RATE
    if excess(high)[0] >= 0:
        return high
    rate = min(max(guess or PRIOR_CHANGES / PRIOR_SECONDS, 2 * low), high / 2)
    for _ in range(100):
        value, slope = excess(rate)
        if value > 0:
            low = rate
        else:
            high = rate
        step = rate - value / slope
        if not low < step < high:
            step = math.sqrt(low * high)
        if abs(step - rate) <= 1e-4 * rate or high / low < 1.0001:
            return step
        rate = step
    return rate


def changed(est: ChangeEstimate | None, content: str) -> bool:
    """True when latest-change's content differs from the last one seen (or none was)."""
    return est is None or est.content != content
