"""The metrics and health server under load: a flood of `/healthz` costs the database one
status a second, an idle client is let go, and connections past the cap are closed."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from typing import Any

import pytest

from lta_worker.worker import _metrics_http
from lta_worker.worker._metrics import Metrics
from lta_worker.worker._metrics_http import MetricsServer, shared
from support.sockets import closed_within


def test_a_flood_of_health_checks_computes_the_status_once() -> None:
    """Twenty concurrent callers within the freshness window share one computation."""
    calls: list[float] = []

    def slow_status() -> dict[str, Any]:
        calls.append(time.monotonic())
        time.sleep(0.2)
        return {"healthy": True}

    health = shared(slow_status, fresh_for=5.0)
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: results.append(health())) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert len(calls) == 1
    assert results == [{"healthy": True}] * 20


def test_a_failed_status_is_not_kept() -> None:
    """A status that raised is computed again by the next caller."""
    answers = iter([RuntimeError("database busy"), {"healthy": True}])

    def flaky() -> dict[str, Any]:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    health = shared(flaky, fresh_for=5.0)
    with pytest.raises(RuntimeError):
        health()
    assert health() == {"healthy": True}


def _server(monkeypatch: pytest.MonkeyPatch, *, cap: int, timeout: float) -> MetricsServer:
    monkeypatch.setattr(_metrics_http, "MAX_CONNECTIONS", cap)
    monkeypatch.setattr(_metrics_http._QuietHandler, "timeout", timeout)
    return MetricsServer("127.0.0.1", 0, Metrics(), lambda: {"healthy": True})


def test_an_idle_client_is_let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that sends nothing is closed after the handler's timeout (slowloris)."""
    server = _server(monkeypatch, cap=4, timeout=0.5)
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as idle:
            assert closed_within(idle, 5.0)
    finally:
        server.close()


def test_connections_past_the_cap_are_closed_and_the_server_stays_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the cap's connections held open, one more is closed at once; once they are let
    go, /metrics answers again."""
    server = _server(monkeypatch, cap=2, timeout=1.0)
    try:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
        time.sleep(0.2)  # both accepted and waiting for a request
        with socket.create_connection(("127.0.0.1", server.port)) as extra:
            assert closed_within(extra, 0.5)
        for sock in held:
            assert closed_within(sock, 5.0)
            sock.close()
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert answer.status == 200
    finally:
        server.close()
