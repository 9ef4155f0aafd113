"""The capacity plan behind `status`."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lta_worker.domain import RECHECKED_STATES, plan_capacity

HOUR = timedelta(hours=1)


def plan(active: int, parked: int = 0, limit: int | None = 120, window: float | None = 3600):
    return plan_capacity(
        users_by_state={"active": active, "parked": parked, "revoked": 5},
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


def test_parked_users_cost_one_read_per_parked_interval() -> None:
    """24 parked users re-checked daily cost one read per hour in total."""
    p = plan(active=0, parked=24)
    assert p.reads_needed_per_hour == pytest.approx(1)


@pytest.mark.parametrize("state", sorted(RECHECKED_STATES))
def test_each_rechecked_state_costs_one_read_per_parked_interval(state: str) -> None:
    """Users in every state the policy re-checks at `parked_interval` (parked, unlinked,
    rejected: derived from its table) cost one read per parked_interval, counted apart."""
    p = plan_capacity(
        users_by_state={"active": 0, state: 24, "revoked": 5},
        reads_per_active_user=2,
        interval=HOUR,
        parked_interval=timedelta(hours=24),
        reserve=0.1,
        budget_limit=120,
        budget_window_seconds=3600,
        fallback_per_hour=60,
    )
    assert p.reads_needed_per_hour == pytest.approx(1)
    assert p.rechecks_per_hour == pytest.approx(1)


def test_the_rechecked_states_come_from_the_policy_table() -> None:
    """The states re-checked at `parked_interval` are those the table schedules at it or
    backs off up to it."""
    assert {"parked", "unlinked", "rejected"} == RECHECKED_STATES


def test_the_window_is_taken_from_the_service() -> None:
    """A budget of 20 per 60 s is 1,200 per hour, less the reserve."""
    p = plan(active=10, limit=20, window=60)
    assert p.available_per_hour == pytest.approx(1080)


def test_without_a_budget_seen_the_fallback_rate_is_used() -> None:
    """Before any header is seen, the plan uses the configured conservative rate."""
    p = plan(active=10, limit=None, window=None)
    assert not p.budget_known
    assert p.available_per_hour == 60


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
