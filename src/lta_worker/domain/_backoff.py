"""Exponential backoff with full jitter, as pure arithmetic (no sleeping, no clock).

The caller turns the delay into a `next_due_at`; see `policy`. Full jitter (a uniform draw
between zero and the exponential ceiling) spreads users who failed together, so a service
that comes back is not met by every backed-off user at the same second.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Final

# 2**62 * any positive base already exceeds every timedelta; stop doubling there.
_MAX_DOUBLINGS: Final = 62


def backoff_ceiling(failures: int, *, base: timedelta, cap: timedelta) -> timedelta:
    """The largest delay after `failures` consecutive failures: base * 2**(n-1), capped.

    Args:
        failures: Consecutive failures so far, this one included; 0 or less means none.
        base: The ceiling after the first failure.
        cap: The ceiling never exceeds this.

    Returns:
        The ceiling; zero when there was no failure or when `cap` or `base` is not positive.
    """
    if failures <= 0 or cap <= timedelta(0) or base <= timedelta(0):
        return timedelta(0)
    doublings = min(failures - 1, _MAX_DOUBLINGS)
    base_s = base.total_seconds()
    cap_s = cap.total_seconds()
    # Compare in floats first: base * 2**62 overflows timedelta.
    if base_s * 2.0**doublings >= cap_s:
        return cap
    return base * (1 << doublings)


def backoff_delay(
    failures: int, *, base: timedelta, cap: timedelta, rng: random.Random
) -> timedelta:
    """A delay drawn uniformly between zero and `backoff_ceiling(failures, base, cap)`.

    Args:
        failures: Consecutive failures so far, this one included.
        base: The ceiling after the first failure (small, e.g. 30 s).
        cap: No delay is ever longer (`poll.interval` for transient failures).
        rng: The source of jitter; tests pass a seeded one.

    Returns:
        A delay with 0 <= delay <= cap.
    """
    ceiling = backoff_ceiling(failures, base=base, cap=cap)
    if ceiling <= timedelta(0):
        return timedelta(0)
    seconds = rng.uniform(0.0, ceiling.total_seconds())
    return min(timedelta(seconds=seconds), ceiling)
