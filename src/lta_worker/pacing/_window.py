"""Window rules: the one home of every limit on the service's untrusted rate-limit figures
(`bound`, `pause_after_429`, `tolerance`); docs/config.md, `ratelimit.max_wait`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Final

from lta_worker.config import RateLimitSettings
from lta_worker.pacing._ratelimit import RateLimitInfo, parse_answer

# After a reset, the first permit waits this long past it: resets are reported in whole
# seconds and seen after the answer's latency, so the local reset may be slightly early.
RESET_MARGIN: Final = 1.0
# Permits of a window are spent only until this long before its reported reset.
SPEND_MARGIN: Final = 1.0
# Two resets closer than this (or than half the window) belong to the same window.
RESET_TOLERANCE: Final = 2.0
# The pause after a 429 that says nothing usable about when to come back.
FALLBACK_429_WAIT: Final = 60.0
# A 429 always pauses at least this long (a `Retry-After: 0` would otherwise spin).
MIN_429_WAIT: Final = 1.0
# The default of `ratelimit.max_wait` (its range: the setting's, checked at load).
DEFAULT_MAX_WAIT: Final = RateLimitSettings().max_wait.total_seconds()
# Counts above this are taken as this: it fits the 32-bit integer columns of the store.
MAX_COUNT: Final = 2**31 - 1


def finite_seconds(value: float | None) -> float | None:
    """`value` when it is a finite number of seconds at least 0, else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def longest_wait(window: float | None, max_wait: float) -> float:
    """The longest any reported wait is trusted: the window when reported (plus a second of
    rounding: resets are whole seconds rounded up), and never beyond `max_wait`."""
    window = finite_seconds(window)
    return min(window + RESET_MARGIN, max_wait) if window else max_wait


def window_length(window: float | None, max_wait: float = DEFAULT_MAX_WAIT) -> float | None:
    """A reported window's length, never beyond `max_wait`; None when absent or invalid."""
    window = finite_seconds(window)
    return min(window, max_wait) if window else None


def clamp_count(value: int | None) -> int | None:
    """A count from the service, capped to `MAX_COUNT`; a negative one is None."""
    if value is None or isinstance(value, bool) or value < 0:
        return None
    return min(int(value), MAX_COUNT)


def bound(
    info: RateLimitInfo | None,
    max_wait: float = DEFAULT_MAX_WAIT,
    *,
    known_window: float | None = None,
) -> RateLimitInfo | None:
    """One answer's figures with every limit applied: waits at most the window (`w=`, or
    `known_window` reported earlier) plus a second and `max_wait`, counts at `MAX_COUNT`."""
    if info is None:
        return None
    window = window_length(info.window, max_wait)
    longest = longest_wait(window or known_window, max_wait)
    return RateLimitInfo(  # built whole: `dataclasses.replace` costs 4x more, per answer
        limit=clamp_count(info.limit),
        remaining=clamp_count(info.remaining),
        reset_after=trusted_wait(info.reset_after, longest),
        window=window,
        retry_after=trusted_wait(info.retry_after, longest),
        source=info.source,
    )


def trusted_wait(value: float | None, longest: float) -> float | None:
    """A reported wait (a reset or `Retry-After`, from seconds or a date) as trusted: at most
    `longest`, and `longest` when it is infinitely far ahead (more digits than any number of
    seconds); None when unusable (absent, negative, NaN)."""
    if value == math.inf:
        return longest
    seconds = finite_seconds(value)
    return None if seconds is None else min(seconds, longest)


def pause_after_429(info: RateLimitInfo | None, max_wait: float = DEFAULT_MAX_WAIT) -> float:
    """Seconds every request is held after a 429: Retry-After, else the reset, bounded."""
    bounded = bound(info, max_wait)
    wait = None if bounded is None else bounded.wait
    if wait is None:
        wait = FALLBACK_429_WAIT
    longest = longest_wait(None if bounded is None else bounded.window, max_wait)
    return min(max(wait, MIN_429_WAIT), max(longest, MIN_429_WAIT))


def wait_after_429(
    headers: Mapping[str, str], now: datetime | None, max_wait: float = DEFAULT_MAX_WAIT
) -> float:
    """Seconds to hold every request after a 429 with these headers at `now`; never raises."""
    try:
        info = parse_answer(headers, now)
    except Exception:  # a hostile header must never break a pass
        info = None
    return pause_after_429(info, max_wait)


def tolerance(*windows: float | None) -> float:
    """Seconds within which two reported resets belong to the same window."""
    longest = max((w for w in (finite_seconds(x) for x in windows) if w), default=0.0)
    return max(RESET_TOLERANCE, longest / 2)
