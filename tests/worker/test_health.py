"""The health verdict (`assess_health`, pure) row by row, and `/healthz`'s WSGI answer: 200
healthy, 503 unhealthy or unknown, a JSON body; other paths 404."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest

from lta_worker.domain import OutboxCounts
from lta_worker.errors import StorageError
from lta_worker.report import assess_health
from lta_worker.worker._metrics import Metrics
from lta_worker.worker._metrics_http import dispatcher

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
    """Each rule: reads failing after the last answered one, users due with no answered read
    for twice poll.interval (or none since the first pass for that long), a breaker or config
    stop (of the last pass or the last that made reads), the capacity warning, rejected users."""
    first = None if first_pass_ago is None else NOW - first_pass_ago
    problems = assess_health(given, now=NOW, interval=HOUR, first_pass_at=first, failing_after=5)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems


def test_answered_kinds_are_the_policys_authenticated_rows() -> None:
    """What health counts as an answered read is what the policy counts as authenticated."""
    from lta_worker.domain import ANSWERED_KINDS, RULES

    assert {kind for kind, rule in RULES.items() if rule.authenticated} == ANSWERED_KINDS


def call(app: Any, path: str) -> tuple[str, dict[str, str], bytes]:
    environ: dict[str, Any] = {"PATH_INFO": path, "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        answer.update(status=status, headers=dict(headers))

    body = b"".join(app(environ, start_response))
    return answer["status"], answer["headers"], body


@pytest.mark.parametrize(
    ("health", "status", "healthy"),
    [
        ({"healthy": True, "problems": []}, "200 OK", True),
        ({"healthy": False, "problems": ["x"]}, "503 Service Unavailable", False),
        (StorageError("the database refused"), "503 Service Unavailable", False),
    ],
)
def test_healthz_answers(health: Any, status: str, healthy: bool) -> None:
    """200 when healthy, 503 when not or when the status cannot be read; JSON either way."""

    def verdict() -> dict[str, Any]:
        if isinstance(health, Exception):
            raise health
        return {**health, "generated_at": "t", "version": "v"}

    got, headers, body = call(dispatcher(Metrics(), verdict), "/healthz")
    assert got == status
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body)["healthy"] is healthy


def test_other_paths_are_404() -> None:
    """Only /metrics and /healthz answer."""
    got, _, _ = call(dispatcher(Metrics(), dict), "/")
    assert got.startswith("404")


class StoreFigures:
    """The few store queries `Metrics.on_store` reads, with fixed answers."""

    def count_by_state(self) -> dict[str, int]:
        return {"active": 4, "dropping": 2}

    def count_due(self, now: datetime) -> int:
        return 1

    def outbox_counts(self) -> OutboxCounts:
        return OutboxCounts(backlog=3, dead=1)


def test_metrics_carry_the_outbox_and_pending_drops_from_the_store() -> None:
    """After a pass the gauges say what the database holds: users by state, due users,
    pending drops, webhook events waiting and dead-lettered."""
    metrics = Metrics()
    metrics.on_store(StoreFigures(), datetime(2025, 1, 1, tzinfo=UTC))  # type: ignore[arg-type]
    value = metrics.registry.get_sample_value
    assert value("lta_worker_users", {"state": "dropping"}) == 2
    assert value("lta_worker_users_due") == 1
    assert value("lta_worker_pending_drops") == 2
    assert value("lta_worker_webhook_backlog") == 3
    assert value("lta_worker_webhook_dead_letters") == 1


@pytest.mark.parametrize(
    ("stopped", "counts", "moves"),
    [
        ("completed", {}, False),
        ("completed", {"transient": 6}, False),
        ("upstream_down", {"transient": 20}, False),
        ("completed", {"ok": 1, "transient": 5}, True),
        ("deadline", {"none": 2}, True),
    ],
)
def test_last_success_is_the_last_pass_with_an_answered_read(
    stopped: str, counts: dict[str, int], moves: bool
) -> None:
    """`lta_worker_last_pass_success_timestamp_seconds` moves only for a pass with a read the
    service answered, whatever it stopped as: a pass that read nobody proves nothing."""
    from collections import Counter

    from lta_worker.worker import PassResult

    metrics = Metrics()
    metrics.last_success.set(1.0)
    result = PassResult(stopped=stopped, exit_code=0, counts=Counter(counts))  # type: ignore[arg-type]
    metrics.on_pass(result, NOW)
    value = metrics.registry.get_sample_value("lta_worker_last_pass_success_timestamp_seconds")
    assert value == (NOW.timestamp() if moves else 1.0)
