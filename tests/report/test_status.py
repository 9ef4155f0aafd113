"""The health verdict (`assess_health`, pure) row by row, and what it counts as an answer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lta_worker.report import assess_health

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
HOUR = timedelta(hours=1)


def _pass(stopped: str, ago: timedelta, answered: int = 2) -> dict[str, Any]:
    finished = (NOW - ago).isoformat()
    counts = {"ok": answered, "transient": 2 - answered if answered < 2 else 0}
    return {"stopped": stopped, "finished_at": finished, "exit_code": 0, "counts": counts}


def data(
    *,
    last: dict[str, Any] | None = None,
    success: dict[str, Any] | None = None,
    last_reads: dict[str, Any] | None = None,
    warning: str | None = None,
    rejected: int = 0,
    due: int = 1,
    active: int = 3,
    failing: int = 0,
    answered_ago: timedelta | None = None,
) -> dict[str, Any]:
    answered = None if answered_ago is None else (NOW - answered_ago).isoformat()
    return {
        "last_pass": last,
        "last_success": success,
        "last_reads": last_reads,
        "reads": {"last_answered_at": answered, "failing": failing},
        "due": due,
        "capacity": {"warning": warning},
        "users": {"active": active, "rejected": rejected},
    }


STALE = 2 * HOUR + timedelta(seconds=1)


@pytest.mark.parametrize(
    ("given", "first_pass_ago", "problem"),
    [
        (data(), None, None),
        (data(last=_pass("completed", HOUR), success=_pass("completed", HOUR)), None, None),
        # No answered read for twice the interval: a problem only while users are due.
        (data(success=_pass("completed", STALE)), None, "no read answered since"),
        (data(success=_pass("completed", STALE), due=0), None, None),
        (data(success=_pass("completed", 2 * HOUR)), None, None),
        (data(answered_ago=STALE), None, "no read answered since"),
        (data(success=_pass("completed", STALE), answered_ago=HOUR), None, None),
        (data(last=_pass("deadline", HOUR)), 3 * HOUR, "no read has been answered yet"),
        (data(last=_pass("deadline", HOUR), due=0), 3 * HOUR, None),
        (data(last=_pass("deadline", HOUR)), HOUR, None),
        # Reads failing after the last answered one: breaker_threshold users, or every
        # active user when fewer; however recent the last success.
        (data(failing=5, answered_ago=HOUR / 6, due=0), None, "reads are failing"),
        (data(failing=4, answered_ago=HOUR / 6, active=10), None, None),
        (data(failing=2, active=2), None, "reads are failing"),
        (data(failing=1, active=0), None, "reads are failing"),
        # A breaker or config stop, also behind passes that read nobody since.
        (data(last=_pass("breaker", HOUR), success=_pass("completed", HOUR)), None, "breaker"),
        (data(last=_pass("config", HOUR), success=_pass("completed", HOUR)), None, "config"),
        (
            data(last=_pass("completed", HOUR, 0), last_reads=_pass("breaker", 2 * HOUR)),
            None,
            "breaker",
        ),
        (data(warning="the budget allows about 10 reads/h"), None, "capacity: the budget"),
        (data(rejected=2), None, "2 user(s) rejected"),
    ],
)
def test_assess_health(
    given: dict[str, Any], first_pass_ago: timedelta | None, problem: str | None
) -> None:
    """Each health rule gives its one problem, and only its own."""
    first = None if first_pass_ago is None else NOW - first_pass_ago
    problems = assess_health(given, now=NOW, interval=HOUR, first_pass_at=first, failing_after=5)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems


def test_failing_reads_name_the_last_answered_pass_when_no_user_read_still_stands() -> None:
    """Failing reads name the last answered pass's time when no user's read still stands."""
    earlier = _pass("completed", timedelta(minutes=5))
    given = data(failing=3, active=3, due=0, success=earlier)
    problems = assess_health(given, now=NOW, interval=HOUR, failing_after=5)
    assert problems == [
        "reads are failing: the last read of 3 user(s) failed (5xx, network or broken answer) "
        f"and no read was answered since {earlier['finished_at']}; see the poll.read events"
    ]


def test_answered_kinds_are_the_policys_authenticated_rows() -> None:
    """What health counts as an answered read is what the policy counts as authenticated."""
    from lta_worker.domain import ANSWERED_KINDS, RULES

    assert {kind for kind, rule in RULES.items() if rule.authenticated} == ANSWERED_KINDS
