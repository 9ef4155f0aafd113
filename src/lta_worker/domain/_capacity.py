"""The capacity plan: can the budget the service reports sustain the configured interval?

Pure arithmetic on plain values; `status` feeds it what the store knows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from lta_worker.domain._durations import format_duration
from lta_worker.domain._policy import RECHECKED_STATES

HOUR = 3600.0
# The longest interval the plan states (a budget of 0, or of one read a century, is no
# plan: it is a warning); beyond it a timedelta would overflow.
LONGEST: Final = timedelta(days=36500)


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """Reads needed per hour against reads available per hour, and the interval users get.

    `available_per_hour` is None when no budget has been seen yet (the plan then uses the
    configured fallback rate, and says so through `budget_known`). `rechecks_per_hour` is the
    part of the reads needed that re-checks users at `parked_interval` (`RECHECKED_STATES`).
    """

    reads_needed_per_hour: float
    rechecks_per_hour: float
    available_per_hour: float
    budget_known: bool
    configured_interval: timedelta
    effective_interval: timedelta
    sustainable: bool
    warning: str | None


def per_hour(limit: float, window_seconds: float | None) -> float:
    """Reads an hour a reported limit allows over its window (an hour when not reported);
    whatever is stored, a finite number at least 0 (a window is at least a second)."""
    window = window_seconds if window_seconds is not None and window_seconds > 0 else HOUR
    reads = max(limit, 0) * HOUR / max(window, 1.0)
    return reads if math.isfinite(reads) else 0.0


def plan_capacity(
    *,
    users_by_state: Mapping[str, int],
    reads_per_active_user: float,
    interval: timedelta,
    parked_interval: timedelta,
    reserve: float,
    budget_limit: int | None,
    budget_window_seconds: float | None,
    fallback_per_hour: float,
    interval_key: str = "poll.interval",
) -> CapacityPlan:
    """Work out the reads per hour the enrolled users need and what the budget allows.

    Args:
        users_by_state: users per state, as `status` counts them.
        reads_per_active_user: reads one active user's turn makes (granted endpoints, 1 or 2).
        interval: `poll.interval`, how often each active user should be read.
        parked_interval: `poll.parked_interval`; users in `RECHECKED_STATES` cost one read
            per check (their first answer ends the turn).
        reserve: the fraction of the budget left for the client's other traffic.
        budget_limit: the limit the service last reported, if any.
        budget_window_seconds: that limit's window, if reported (else an hour is assumed
            only for this estimate; the pacer itself never assumes it).
        fallback_per_hour: the configured conservative rate used before any header is seen.
            The budget is per client: more instances share it, they do not add to it.
        interval_key: the setting `interval` comes from, for the warning.

    Returns:
        The plan, with a warning when the budget cannot sustain the configured interval.
    """
    active = users_by_state.get("active", 0)
    rechecked = sum(users_by_state.get(s, 0) for s in RECHECKED_STATES)
    rechecks = rechecked * HOUR / parked_interval.total_seconds()
    needed = active * reads_per_active_user * HOUR / interval.total_seconds() + rechecks

    known = budget_limit is not None
    if budget_limit is not None:
        available = per_hour(budget_limit, budget_window_seconds) * (1.0 - reserve)
    else:
        available = fallback_per_hour

    if needed <= 0 or available >= needed:
        effective = interval
    elif needed < available * (LONGEST / interval):
        effective = timedelta(seconds=interval.total_seconds() * needed / available)
    else:
        effective = LONGEST
    sustainable = needed <= available
    warning = None
    if budget_limit is not None and budget_limit <= 0:
        warning = (
            "the service reports a limit of 0: no read can be made until it allows some "
            "(reads resume by themselves when it does); ask for a budget"
        )
    elif not sustainable:
        warning = (
            f"the budget allows about {available:.0f} reads/h but the enrolled users need "
            f"{needed:.0f} reads/h at the configured interval: each user will be read about "
            f"every {format_duration(effective)} instead; raise {interval_key} or ask for "
            "a larger budget"
        )
    return CapacityPlan(
        reads_needed_per_hour=needed,
        rechecks_per_hour=rechecks,
        available_per_hour=available,
        budget_known=known,
        configured_interval=interval,
        effective_interval=effective,
        sustainable=sustainable,
        warning=warning,
    )
