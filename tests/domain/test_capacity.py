"""The capacity plan behind `status`."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lta_worker.config import PollSettings
from lta_worker.domain import (
    RECHECKED_STATES,
    ChangeEstimate,
    class_intervals,
    expected_delay,
    plan_capacity,
    plan_scale,
)
from lta_worker.domain._freshness import cap_seconds, next_due

HOUR = timedelta(hours=1)


def plan(
    active: int,
    parked: int = 0,
    limit: int | None = 120,
    window: float | None = 3600,
    state: str = "parked",
):
    return plan_capacity(
        users_by_state={"active": active, state: parked, "revoked": 5},
        reads_per_active_user=2,
        interval=HOUR,
        parked_interval=timedelta(hours=24),
        reserve=0.1,
        budget_limit=limit,
        budget_window_seconds=window,
        fallback_per_hour=60,
    )


def test_a_sustainable_load_keeps_the_configured_interval() -> None:
    """50 users x 2 reads/h fit in 120/h less 10%: the interval stays one hour, no warning."""
    p = plan(active=50)
    assert p.reads_needed_per_hour == pytest.approx(100)
    assert p.available_per_hour == pytest.approx(108)
    assert p.sustainable
    assert p.effective_interval == HOUR
    assert p.warning is None


def test_an_overloaded_budget_stretches_the_interval_and_warns() -> None:
    """108 users need 216 reads/h against 108: each is read every 2 h, with a warning."""
    p = plan(active=108)
    assert not p.sustainable
    assert p.effective_interval == timedelta(hours=2)
    assert p.warning is not None
    assert "2h" in p.warning


@pytest.mark.parametrize("state", sorted(RECHECKED_STATES))
def test_each_rechecked_state_costs_one_read_per_parked_interval(state: str) -> None:
    """24 users of a state re-checked daily (parked, unlinked, rejected) cost one read an hour."""
    p = plan(active=0, parked=24, state=state)
    assert p.reads_needed_per_hour == pytest.approx(1)
    assert p.rechecks_per_hour == pytest.approx(1)


def test_the_rechecked_states_come_from_the_policy_table() -> None:
    """The states re-checked at `parked_interval` are the policy table's."""
    assert {"parked", "unlinked", "rejected"} == RECHECKED_STATES


@pytest.mark.parametrize(
    ("limit", "window", "available"),
    [
        pytest.param(20, 60, 1080, id="20-per-60s-is-1200-an-hour-less-the-reserve"),
        pytest.param(None, None, 60, id="no-budget-seen-the-fallback-rate"),
    ],
)
def test_the_reads_available_come_from_the_service_or_the_fallback(
    limit: int | None, window: float | None, available: float
) -> None:
    """The budget the service reported, per hour less the reserve, or the fallback rate."""
    p = plan(active=10, limit=limit, window=window)
    assert p.budget_known is (limit is not None)
    assert p.available_per_hour == pytest.approx(available)


@given(
    active=st.integers(0, 10**6),
    limit=st.integers(1, 10**5),
    window=st.floats(1, 86400),
)
def test_effective_interval_never_shorter_than_configured(
    active: int, limit: int, window: float
) -> None:
    """Whatever the load and budget, users are never promised more than the interval."""
    p = plan(active=active, limit=limit, window=window)
    assert p.effective_interval >= HOUR
    assert p.sustainable == (p.reads_needed_per_hour <= p.available_per_hour)


ADAPTIVE = replace(PollSettings().policy().freshness, schedule="adaptive")
NOW = datetime(2026, 1, 1, tzinfo=UTC)
absurd_windows = (
    st.none()
    | st.floats(min_value=1.0, max_value=2.0**63)
    | st.sampled_from([0.0, -1.0, math.nan, math.inf, 1e-300])
)


@given(
    active=st.integers(0, 10**9),
    parked=st.integers(0, 10**9),
    limit=st.none() | st.integers(0, 2**63) | st.sampled_from([0, 2**31, -1]),
    window=absurd_windows,
    rates=st.lists(st.sampled_from([(1e-7, 1e-7, 1.0), (1e-3, 1e-3, 1000.0)]), max_size=3),
)
@example(active=12, parked=0, limit=0, window=3600.0, rates=[(1e-3, 1e-3, 12.0)])
def test_no_stored_budget_breaks_the_capacity_or_freshness_plan(
    active: int,
    parked: int,
    limit: int | None,
    window: float | None,
    rates: list[tuple[float, float, float]],
) -> None:
    """Any stored budget (0, 2^63, none): both plans hold, and a limit of 0 is a warning."""
    p = plan(active=active, parked=parked, limit=limit, window=window)
    assert p.effective_interval >= HOUR and 0 <= p.available_per_hour < math.inf
    if limit == 0:  # whatever the users need: `status` shows it as a problem
        assert p.warning is not None and "a limit of 0" in p.warning
    budget = max(p.available_per_hour - p.rechecks_per_hour, 0.0)
    schedule = plan_scale(rates, budget, ADAPTIVE)
    due = next_due(ChangeEstimate(), NOW, schedule, ADAPTIVE)
    assert NOW + ADAPTIVE.interval <= due <= NOW + ADAPTIVE.max_interval
    classes = class_intervals(rates, schedule, ADAPTIVE)
    if budget == 0:  # no read to spread: everyone at the cap, nobody at the floor
        assert all(seconds == cap_seconds(ADAPTIVE) for _, _, seconds, _ in classes)
    expected_delay(rates, schedule, ADAPTIVE)
