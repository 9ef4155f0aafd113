"""B5's new users: a cohort enrolled into a settled population mid-run (issue 38, item 4).

Every `COHORT_EVERY`-th user of a population (5 %) is enrolled half-way through the run
(day 7 of 14), the others at the start. The worker and round robin on change read the same
population at the same budget; for the cohort, the figures are its time to first read (from
enrollment to the first turn's arrival) and its mean delay over its first `FIRST_DAYS`
days, and for the worker how many new users were read after a settled user that was not
overdue when they enrolled (enrollment makes a user due at once, and the claim takes the
oldest due first: none should be).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from bench.b5_policies import Schedule
from bench.b5_workload import Workload

COHORT_EVERY = 20  # every 20th user: 5 %
FIRST_DAYS = 3
HOURS_A_DAY = 24.0


def enrollment(workload: Workload) -> tuple[list[float], float]:
    """When each user is enrolled (hours), and the cohort's enrollment: half-way through."""
    at = workload.days // 2 * HOURS_A_DAY
    n = len(workload.users)
    return [at if i % COHORT_EVERY == COHORT_EVERY - 1 else 0.0 for i in range(n)], at


def run_end(workload: Workload, at: float) -> float:
    """Where a cohort run may stop: a day after the cohort's first days (a change in them
    is read within `poll.max_interval`), or the run's end."""
    return min(float(workload.hours), at + (FIRST_DAYS + 1) * HOURS_A_DAY)


def figures(
    workload: Workload, schedule: Schedule, enrolled: Sequence[float], at: float, end: float
) -> dict[str, Any]:
    """The cohort's time to first read (mean and longest) and mean delay over its first days."""
    first: list[float] = []
    delays: list[float] = []
    until = min(end, at + FIRST_DAYS * HOURS_A_DAY)
    for user, turns, when in zip(workload.users, schedule.turns, enrolled, strict=True):
        if when != at or not at:
            continue
        k = bisect.bisect_left(turns, at)
        first.append((turns[k] if k < len(turns) else end) - at)
        for c in user.changes:
            if at <= c < until:
                k = bisect.bisect_left(turns, c)
                delays.append((turns[k] if k < len(turns) else end) - c)
    return {
        "users": len(first),
        "first_read_mean_h": sum(first) / len(first) if first else None,
        "first_read_max_h": max(first, default=None),
        "mean_delay_h": sum(delays) / len(delays) if delays else None,
        "changes": len(delays),
    }


def read_out_of_turn(schedule: Schedule, enrolled: Sequence[float], at: float) -> int:
    """How many (new user, settled user) pairs have the new user's first read after the
    settled user's next read, the settled user not overdue at the enrollment (its due time,
    set by its last turn before it, later than `at`). Needs the worker's `dues`."""
    firsts = [
        turns[bisect.bisect_left(turns, at)]
        for turns, when in zip(schedule.turns, enrolled, strict=True)
        if when == at and at and bisect.bisect_left(turns, at) < len(turns)
    ]
    count = 0
    for turns, dues, when in zip(schedule.turns, schedule.dues, enrolled, strict=True):
        if when == at:
            continue
        k = bisect.bisect_right(turns, at)  # its turns up to the enrollment
        if not k or k == len(turns) or dues[k - 1] <= at:
            continue  # due since 0, never read again, or overdue
        count += sum(1 for f in firsts if f > turns[k])
    return count
