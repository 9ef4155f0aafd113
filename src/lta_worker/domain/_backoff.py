"""Exponential backoff with full jitter, as pure arithmetic (no sleeping, no clock): a uniform
draw up to the ceiling spreads users who failed together, so a service that comes back is not
met by all of them at the same second.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Final

# 2**62 * any positive base already exceeds every timedelta; stop doubling there.
_MAX_DOUBLINGS: Final = 62


def backoff_ceiling(failures: int, *, base: timedelta, cap: timedelta) -> timedelta:
    """The largest delay after `failures` consecutive failures (this one included):
    base * 2**(n-1), capped; zero without a failure or when `cap` or `base` is not positive."""
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
    """A delay drawn uniformly between zero and `backoff_ceiling(failures, base, cap)`."""
    ceiling = backoff_ceiling(failures, base=base, cap=cap)
    if ceiling <= timedelta(0):
        return timedelta(0)
    seconds = rng.uniform(0.0, ceiling.total_seconds())
    return min(timedelta(seconds=seconds), ceiling)
