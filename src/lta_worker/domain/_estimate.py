"""What the reads of one user observed of its changes: the estimate and how it learns.

Pure; no I/O, every function takes `now`. After Cho and Garcia-Molina ("Estimating
frequency of change", TOIT 2003): a read only tells whether latest-change's content
differs from the stored one (its content hash), not how many changes happened in between.
`observe` folds each such observation into a decayed count of changes and of time observed
(an EM step for interval-censored Poisson changes: a changed read over an interval counts
Lambda / (1 - exp(-Lambda)) expected changes, Lambda the changes the estimate expected, so
at least one), per slice of the day in UTC, so that a user who changes only in its own
waking hours, whatever its time zone, is read then. Old observations fade with
`rate_half_life`, so a user who turns idle, or busy, is followed within days.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from lta_worker.domain._freshness import FreshnessConfig

HOUR: Final = 3600.0
BINS: Final = 6
BIN_SECONDS: Final = 24 * HOUR / BINS
# The prior: as if a quarter change had been seen over six hours (one a day), so a new
# user is read like an ordinary one until its own reads say otherwise; it fades in days.
PRIOR_CHANGES: Final = 0.25
PRIOR_SECONDS: Final = 6 * HOUR
# Reads go as rate**EXPONENT: 1/2 is the square-root rule (B5: 0.6 and 0.7 do worse).
EXPONENT: Final = 0.5
# No rate above one change a minute is believed (keeps the EM step finite when every
# read saw a change).
MAX_RATE: Final = 1 / 60.0


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
    """

    changes: tuple[float, ...] = (0.0,) * BINS
    observed: tuple[float, ...] = (0.0,) * BINS
    content: str | None = None
    seen_at: datetime | None = None
    stats_at: datetime | None = None

    def rates(self) -> tuple[float, ...]:
        """Estimated changes per second in each slice of the day (the prior until reads say
        otherwise)."""
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
        }

    @classmethod
    def from_json(cls, raw: Any) -> ChangeEstimate | None:
        """The estimate back from `to_json`; None for anything else (a fresh start)."""
        try:
            changes = tuple(float(c) for c in raw["c"])
            observed = tuple(float(o) for o in raw["o"])
            if len(changes) != BINS or len(observed) != BINS:
                return None
            return cls(
                changes=changes,
                observed=observed,
                content=str(raw["h"]) if raw.get("h") is not None else None,
                seen_at=_stamp(raw.get("s")),
                stats_at=_stamp(raw.get("t")),
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


def content_hash(status: str, payload: Any) -> str:
    """A short hash of an answer's content: status and canonical JSON of the payload."""
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{status}:{body}".encode()).hexdigest()[:32]


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

    The interval since the previous read is observed time, shared out over the slices of
    the day it covered; a change seen counts lambda / (1 - exp(-lambda)) expected changes
    (lambda: the changes the estimate expected in the interval, so at least one), shared
    over the slices in proportion to what each expected.
    """
    if est.content is None or est.seen_at is None:
        return replace(est, content=content, seen_at=now)
    seconds = (now - est.seen_at).total_seconds()
    if seconds <= 0:
        return replace(est, content=content, seen_at=now)
    decay = 0.5 ** (seconds / cfg.rate_half_life.total_seconds())
    changes = [c * decay for c in est.changes]
    observed = [o * decay for o in est.observed]
    rates = est.rates()
    parts = slices(est.seen_at, seconds)
    for index, took in parts:
        observed[index] += took
    if content != est.content:
        weights = [(index, rates[index] * took) for index, took in parts]
        expected = sum(w for _, w in weights)
        total = expected / -math.expm1(-expected) if expected > 1e-9 else 1.0
        for index, weight in weights:
            changes[index] += total * weight / expected if expected > 1e-9 else total / len(parts)
    return ChangeEstimate(
        changes=tuple(changes),
        observed=tuple(observed),
        content=content,
        seen_at=now,
        stats_at=est.stats_at,
    )


def changed(est: ChangeEstimate | None, content: str) -> bool:
    """True when latest-change's content differs from the last one seen (or none was)."""
    return est is None or est.content != content
