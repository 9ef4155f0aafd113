"""`/healthz`'s WSGI answer: 200 healthy, 503 unhealthy or unknown, a JSON body; other
paths 404 (the verdict itself, `assess_health`: tests/report/test_status.py); and the
metrics the store's figures and the passes feed."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest

from lta_worker.domain import OutboxCounts
from lta_worker.errors import StorageError
from lta_worker.worker._metrics import Metrics
from lta_worker.worker._metrics_http import dispatcher

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


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
    """After a pass the gauges say what the database holds (states, due, drops, outbox)."""
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
    """The last-success timestamp moves only for a pass with an answered read."""
    from collections import Counter

    from lta_worker.worker import PassResult

    metrics = Metrics()
    metrics.last_success.set(1.0)
    result = PassResult(stopped=stopped, exit_code=0, counts=Counter(counts))  # type: ignore[arg-type]
    metrics.on_pass(result, NOW)
    value = metrics.registry.get_sample_value("lta_worker_last_pass_success_timestamp_seconds")
    assert value == (NOW.timestamp() if moves else 1.0)
