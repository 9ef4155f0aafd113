"""Backoff arithmetic: exponential ceiling, full jitter, the cap."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lta_worker.domain import backoff_delay
from lta_worker.domain._backoff import backoff_ceiling

BASE = timedelta(seconds=30)
CAP = timedelta(hours=1)

failures = st.integers(min_value=-5, max_value=10_000)
bases = st.timedeltas(min_value=timedelta(milliseconds=1), max_value=timedelta(days=1))
caps = st.timedeltas(min_value=timedelta(seconds=1), max_value=timedelta(days=30))


@pytest.mark.parametrize(
    ("n", "ceiling"),
    [
        pytest.param(0, timedelta(0), id="no-failure"),
        pytest.param(1, timedelta(seconds=30), id="first-is-base"),
        pytest.param(2, timedelta(seconds=60), id="doubles"),
        pytest.param(5, timedelta(seconds=480), id="fifth"),
        pytest.param(8, timedelta(hours=1), id="capped"),
        pytest.param(10_000, timedelta(hours=1), id="no-overflow"),
    ],
)
def test_ceiling_doubles_from_base_until_cap(n: int, ceiling: timedelta) -> None:
    """The ceiling is base * 2**(n-1), capped, and zero without a failure."""
    assert backoff_ceiling(n, base=BASE, cap=CAP) == ceiling


@given(n=failures, base=bases, cap=caps, seed=st.integers())
def test_delay_is_between_zero_and_cap(n: int, base: timedelta, cap: timedelta, seed: int) -> None:
    """Every delay is within [0, cap] and within the ceiling of its failure count."""
    delay = backoff_delay(n, base=base, cap=cap, rng=random.Random(seed))
    assert timedelta(0) <= delay <= backoff_ceiling(n, base=base, cap=cap) <= cap


@given(n=st.integers(min_value=1, max_value=200), base=bases, cap=caps)
def test_ceiling_grows_until_cap(n: int, base: timedelta, cap: timedelta) -> None:
    """The ceiling never shrinks with more failures and equals base*2**(n-1) below the cap."""
    here = backoff_ceiling(n, base=base, cap=cap)
    assert backoff_ceiling(n + 1, base=base, cap=cap) >= here
    if base.total_seconds() * 2.0 ** (n - 1) < cap.total_seconds():
        assert here == base * 2 ** (n - 1)
    else:
        assert here == cap


def test_full_jitter_spreads_delays_over_the_range() -> None:
    """Delays after one failure count spread over [0, ceiling], drawn from the injected rng."""
    rng = random.Random(7)
    delays = [backoff_delay(4, base=BASE, cap=CAP, rng=rng).total_seconds() for _ in range(500)]
    assert min(delays) < 0.1 * 240
    assert max(delays) > 0.9 * 240
    assert all(0 <= d <= 240 for d in delays)
    same = [backoff_delay(4, base=BASE, cap=CAP, rng=random.Random(7)) for _ in range(2)]
    assert same[0] == same[1] == timedelta(seconds=delays[0])  # only the injected generator
