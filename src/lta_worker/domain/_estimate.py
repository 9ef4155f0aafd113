"""What the reads of one user observed of its changes: the estimate and how it learns.

Pure, taking `now`. A read tells only whether latest-change moved (Cho and Garcia-Molina,
TOIT 2003); `observe` folds that bit, by Bayes' rule, into two beliefs: the level (the day's
mean rate, over `GRID`, its prior the population's) and the day's shape (a flat day or a
waking window, `WINDOWS`); either may start over (`rate_half_life`, `WINDOW_HALF_LIVES`).
The stored form (`to_json`) keeps `c` / `o` per four-hour slice, read by earlier versions,
beside `w`. docs/config.md, *Freshness*, says what each trades.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from itertools import accumulate, repeat
from operator import mul, truediv
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from lta_worker.domain._freshness import FreshnessConfig

HOUR: Final = 3600.0
DAY: Final = 24 * HOUR
# The schedule walks the day hour by hour (`slices`, `ChangeEstimate.rates`).
BINS: Final = 24
BIN_SECONDS: Final = DAY / BINS
# Before any interval was read: one change a day.
UNREAD_RATE: Final = 1 / DAY
# Reads go as rate**EXPONENT: 1/2 is the square-root rule (B5: 0.6 and 0.7 do worse).
EXPONENT: Final = 0.5
# No rate above one change a minute is believed (keeps the likelihoods finite).
MAX_RATE: Final = 1 / 60.0
# The level's belief: a probability per rate of a log grid, 0.01 to 1000 changes a day.
GRID_SIZE: Final = 41
GRID: Final = tuple(0.01 / 86400 * 10 ** (7 * k / (GRID_SIZE - 1)) for k in range(GRID_SIZE))
# Waking windows' lengths in hours (B5: 13 to 17 took 0.01-0.05 off `waking` and `sessions`,
# put up to 0.016 on `builtin`, whose users all wake 16 h; 1.6 x the CPU of a read's update).
LENGTHS: Final = (13, 14, 15, 16, 17)
# A window's rate outside its hours, as a share of inside; the flat day stands for those who
# change at night (B5: 0.05 cost 0.5-2.5 % of mean delay).
OUTSIDE: Final = 0.02
# The day starts over this many times slower than the level (B5: 1 blurred the windows; at
# 20 a user who moves its hours by half a day needs over two days, tests/domain).
WINDOW_HALF_LIVES: Final = 4
# The prior's weight on a flat day: a window must be earned, and a user who starts over is
# read all day until its reads say when (B5: 0.2 left woken users 1.03 x round robin, 0.6 0.98).
FLAT_PRIOR: Final = 0.6
# The stored summary for versions before the window: four-hour slices, each as if observed
# this long (a few of their half-lives of reads before their own counts outweigh it).
SUMMARY_BINS: Final = 6
SUMMARY_SECONDS: Final = DAY
# Stored window weights: tenths of a nat below the largest (a 5 % step), down to a billionth;
# a byte each, in base64.
LOG_SCALE: Final = 10.0
WEIGHT_FLOOR: Final = 1e-9
_WEIGHTS: Final = tuple(
    math.exp(-k / LOG_SCALE) for k in range(1 + round(-LOG_SCALE * math.log(WEIGHT_FLOOR)))
)


def _default_prior() -> tuple[float, ...]:
    """Before the population says otherwise: log-normal about one change a day, wide."""
    weights = [math.exp(-0.5 * (math.log(g * 86400) / 2.0) ** 2) for g in GRID]
    total = sum(weights)
    return tuple(w / total for w in weights)


DEFAULT_PRIOR: Final = _default_prior()


def _window_table() -> tuple[tuple[int, int, float, float], ...]:
    """(first hour, end hour on a two-day axis, rate outside, inside less outside) per window,
    rates as a share of the day's mean: the flat day first, then each length's 24 starts."""
    table = [(0, 24, 1.0, 0.0)]
    for length in LENGTHS:
        inside = BINS / (length + (BINS - length) * OUTSIDE)
        table += [(s, s + length, OUTSIDE * inside, inside - OUTSIDE * inside) for s in range(BINS)]
    return tuple(table)


WINDOWS: Final = _window_table()
WINDOW_PRIOR: Final = (FLAT_PRIOR,) + ((1 - FLAT_PRIOR) / (len(WINDOWS) - 1),) * (len(WINDOWS) - 1)


def _window_hours(window: tuple[int, int, float, float]) -> tuple[float, ...]:
    start, end, outside, more = window
    return tuple(
        outside + (more if start <= h < end or start <= h + BINS < end else 0.0)
        for h in range(BINS)
    )


WINDOW_HOURS: Final = tuple(_window_hours(w) for w in WINDOWS)
# Each window's mean rate per stored four-hour slice (the summary, and reading it back).
_PER_SLICE: Final = BINS // SUMMARY_BINS
WINDOW_SLICES: Final = tuple(
    tuple(sum(h[k * _PER_SLICE : (k + 1) * _PER_SLICE]) / _PER_SLICE for k in range(SUMMARY_BINS))
    for h in WINDOW_HOURS
)


def _hourly(window: tuple[float, ...]) -> tuple[float, ...]:
    """The window belief's mean shape: rate per hour of the day (UTC) over the day's mean.
    Per length a prefix sum over two days of starts: a few passes of 24, not windows x hours."""
    out = [window[0]] * BINS
    at = 1
    for length in LENGTHS:
        starts = window[at : at + BINS]
        outside, more = WINDOWS[at][2], WINDOWS[at][3]
        at += BINS
        q = list(accumulate(starts * 2, initial=0.0))
        base = outside * q[BINS]
        out = [
            o + base + more * (q[h + BINS + 1] - q[h + BINS + 1 - length])
            for h, o in enumerate(out)
        ]
    return tuple(out)


_PRIOR_HOURS: Final = _hourly(WINDOW_PRIOR)


@dataclass(frozen=True, slots=True)
class ChangeEstimate:
    """What the reads of one user have observed, stored with the user.

    `content` is the hash of the last latest-change answer (None: never read), `seen_at`
    when it was read. `level` (the mean of `belief`, the probability of each rate of `GRID`)
    and `window` (the probability of each of `WINDOWS` being the user's day) are None
    before any interval was read: then the population's prior and `WINDOW_PRIOR` hold.
    """

    content: str | None = None
    seen_at: datetime | None = None
    stats_at: datetime | None = None
    level: float | None = None
    belief: tuple[float, ...] | None = None
    window: tuple[float, ...] | None = None
    # `hourly()`'s, worked out when first asked (the schedule asks after each read; a read
    # of the stored row for its content hash alone does not).
    _hourly: tuple[float, ...] | None = field(default=None, init=False, compare=False, repr=False)

    def hourly(self) -> tuple[float, ...]:
        """Rate per hour of the day (UTC) over the mean: `window`'s mean shape."""
        hours = self._hourly
        if hours is None:
            hours = _PRIOR_HOURS if self.window is None else _hourly(self.window)
            object.__setattr__(self, "_hourly", hours)
        return hours

    def rates(self) -> tuple[float, ...]:
        """Estimated changes per second per hour of the day (UTC): level times the day's shape."""
        level = UNREAD_RATE if self.level is None else self.level
        return tuple(min(level * h, MAX_RATE) for h in self.hourly())

    def rate(self) -> float:
        """The rate the budget plans with: (mean of sqrt(rate) over the day) squared.

        A user read at intensity sqrt(rate(t)) costs this many reads as one read at a
        steady `scale / sqrt(rate)` interval would.
        """
        return float((sum(r**EXPONENT for r in self.rates()) / BINS) ** (1 / EXPONENT))

    def to_json(self) -> dict[str, Any]:
        """The estimate as stored (JSON: floats rounded, times as ISO strings).

        `c` / `o` are what versions before the window read: the changes per four-hour slice
        the rates say in `SUMMARY_SECONDS` of it. `w`: each window's log weight under the
        largest, in tenths of a nat (`LOG_SCALE`), a byte per window in base64.
        """
        level = UNREAD_RATE if self.level is None else self.level
        hours, per = self.hourly(), level * SUMMARY_SECONDS / _PER_SLICE
        out: dict[str, Any] = {
            "c": [
                round(per * sum(hours[k * _PER_SLICE : (k + 1) * _PER_SLICE]), 4)
                for k in range(SUMMARY_BINS)
            ],
            "o": [SUMMARY_SECONDS] * SUMMARY_BINS,
            "h": self.content,
            "s": self.seen_at.isoformat() if self.seen_at else None,
            "t": self.stats_at.isoformat() if self.stats_at else None,
            "l": self.level,
            "b": None if self.belief is None else [float(f"{b:.4g}") for b in self.belief],
        }
        out["w"] = None  # present: the new form (absent: an older one's, read by its counts)
        if self.window is not None:
            top = max(self.window)
            codes = (int(0.5 - LOG_SCALE * math.log(w / top + WEIGHT_FLOOR)) for w in self.window)
            out["w"] = base64.b64encode(bytes(codes)).decode()  # rounded, never below the floor
        return out

    @classmethod
    def from_json(cls, raw: Any) -> ChangeEstimate | None:
        """The estimate back from `to_json`, or from an older version's (its window belief
        from its counts per slice); None for anything else (a fresh start)."""
        try:
            changes = tuple(float(c) for c in raw["c"])
            observed = tuple(float(o) for o in raw["o"])
            if len(changes) != SUMMARY_BINS or len(observed) != SUMMARY_BINS:
                return None
            belief = _stored_belief(raw, changes, observed)
            window: tuple[float, ...] | None
            stored = raw.get("w")
            if "w" in raw and stored is None:
                window = None
            else:
                window = _stored_window(stored)
                if window is None and belief is not None:
                    window = _seeded_window(changes, observed)
            return cls(
                content=str(raw["h"]) if raw.get("h") is not None else None,
                seen_at=_stamp(raw.get("s")),
                stats_at=_stamp(raw.get("t")),
                level=None if belief is None else _mean(belief),
                belief=belief,
                window=window,
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
        return self.mean_rate() * DAY


def content_hash(status: str, content: bytes) -> str:
    """A short hash of an answer's content: its status and the payload's canonical JSON."""
    return hashlib.sha256(status.encode() + b":" + content).hexdigest()[:32]


def _mean(belief: Sequence[float]) -> float:
    """The mean rate a belief over `GRID` gives."""
    return float(sum(map(mul, belief, GRID)))


def _stored_window(stored: Any) -> tuple[float, ...] | None:
    """The stored window belief (`w`); None when absent or of another layout (counts seed it)."""
    codes = base64.b64decode(stored, validate=True) if isinstance(stored, str) else b""
    if len(codes) != len(WINDOWS) or max(codes) >= len(_WEIGHTS):
        return None
    weights = [_WEIGHTS[c] for c in codes]
    return tuple(map(truediv, weights, repeat(sum(weights))))


def _seeded_window(changes: Sequence[float], observed: Sequence[float]) -> tuple[float, ...]:
    """The window belief an older version's counts per four-hour slice say: the prior times
    each window's likelihood of them (Poisson counts at its rate per slice, the level at its
    best for that window: sum c log s - C log sum s o, s the window's rate per slice)."""
    total = sum(changes)
    logs = [
        math.log(p)
        + sum(c * math.log(s) for c, s in zip(changes, shape, strict=True) if c > 0)
        - total * math.log(max(sum(map(mul, shape, observed)), 1e-9))
        for p, shape in zip(WINDOW_PRIOR, WINDOW_SLICES, strict=True)
    ]
    top = max(logs)
    weights = [math.exp(x - top) for x in logs]
    norm = sum(weights)
    return tuple(w / norm for w in weights)


def _stored_belief(
    raw: Any, changes: Sequence[float], observed: Sequence[float]
) -> tuple[float, ...] | None:
    """The belief as stored (`b`), else the default prior times an older version's evidence:
    `m`/`q` (reads that saw a change, per length step; seconds of reads that saw none) or,
    before the level, the counts per slice. An upgrade keeps what every user's reads said."""
    stored = raw.get("b")
    if stored is not None:
        belief = tuple(float(b) for b in stored)
        total = sum(belief)
        if len(belief) != GRID_SIZE or any(not b >= 0 for b in belief) or total <= 0:
            raise ValueError("belief")
        return tuple(map(truediv, belief, repeat(total)))
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
    """(hour of the day, seconds) covered by [start, start + seconds)."""
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


def _covered(start: datetime, seconds: float) -> list[float]:
    """Prefix sums over two days of hours of the seconds [start, start + seconds) spent in
    each hour of the day: hours a to b (b <= a + 24) hold p[b] - p[a] of them."""
    days, rest = divmod(seconds, DAY)
    cover = [days * HOUR] * BINS
    at = start.timestamp() % DAY
    hour = int(at // HOUR)
    take = min(rest, (hour + 1) * HOUR - at)
    while rest > 0:
        cover[hour % BINS] += take
        rest -= take
        hour += 1
        take = min(rest, HOUR)
    return list(accumulate(cover * 2, initial=0.0))


def observe(
    est: ChangeEstimate,
    content: str,
    now: datetime,
    cfg: FreshnessConfig,
    prior: Sequence[float] | None = None,
) -> ChangeEstimate:
    """Fold one latest-change read (its content hash) into the estimate: the window belief at
    the current level (a window that puts the interval in the user's waking hours expects
    more changes), the level's (`update_belief`; `prior` the population's, else the default)
    at the span the window belief expected (each window's seconds weighted by its rate)."""
    if est.content is None or est.seen_at is None:
        return replace(est, content=content, seen_at=now)
    seconds = (now - est.seen_at).total_seconds()
    if seconds <= 0:
        return replace(est, content=content, seen_at=now)
    prior = prior or DEFAULT_PRIOR
    moved = content != est.content
    cover = _covered(est.seen_at, seconds)
    spans = [out * seconds + more * (cover[e] - cover[s]) for s, e, out, more in WINDOWS]
    old = WINDOW_PRIOR if est.window is None else est.window
    level = _mean(prior) if est.level is None else est.level
    start = _start_over(seconds / WINDOW_HALF_LIVES, cfg)
    window = _bayes(old, WINDOW_PRIOR, spans, level, moved, start)
    span = sum(map(mul, old, spans))  # the interval at the mean rate
    belief = update_belief(est.belief, moved, span=span, seconds=seconds, cfg=cfg, prior=prior)
    return ChangeEstimate(
        content=content,
        seen_at=now,
        stats_at=est.stats_at,
        level=_mean(belief),
        belief=belief,
        window=window,
    )


def _bayes(  # noqa: PLR0917  (one call per belief, each argument a part of the step)
    old: Sequence[float],
    prior: Sequence[float],
    base: Sequence[float],
    scale: float,
    moved: bool,
    start: float,
) -> tuple[float, ...]:
    """A belief after a read whose hypotheses expected `base` x `scale` changes: the chance
    `start` of starting over from `prior`, then Bayes' rule (1 - exp(-x) for a change seen,
    exp(-x) for none). `prior` when nothing explains the read."""
    keep = 1 - start
    if moved:
        out = [
            (keep * b + start * p) * -math.expm1(-scale * x)
            for b, p, x in zip(old, prior, base, strict=True)
        ]
    else:
        out = [
            (keep * b + start * p) * math.exp(-scale * x)
            for b, p, x in zip(old, prior, base, strict=True)
        ]
    total = sum(out)
    if not total > 0:
        return tuple(prior)
    return tuple(map(truediv, out, repeat(total)))


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
    old = prior if belief is None else belief
    return _bayes(old, prior, GRID, span, moved, _start_over(seconds, cfg))


def _start_over(seconds: float, cfg: FreshnessConfig) -> float:
    """The chance that a user started over in `seconds`: 1 - 2^(-seconds / rate_half_life)."""
    return -math.expm1(-seconds * math.log(2) / cfg.rate_half_life.total_seconds())


def changed(est: ChangeEstimate | None, content: str) -> bool:
    """True when latest-change's content differs from the last one seen (or none was)."""
    return est is None or est.content != content
