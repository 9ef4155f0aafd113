"""Metrics and health scraped over HTTP from a running `serve` (`[metrics] listen`)."""

from __future__ import annotations

import json
import signal
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from support.process import NotifySocket, Workspace, free_port, stop, wait_for, write_private
from support.prometheus import http_get as get

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, keyed by name and sorted labels."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_serve_answers_metrics_and_healthz(world: Workspace, notify: NotifySocket) -> None:
    """After a pass, /metrics holds every family and /healthz agrees with `status --format json`."""
    port = free_port()
    world.extra = f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
    world.write_config()
    world.enroll(["ada", "bob", "cy"])
    proc = world.start_serve(NOTIFY_SOCKET=str(notify.path))
    try:
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("pass 1:"))
        status, text = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        got = samples(text)
        health_status, body = get(f"http://127.0.0.1:{port}/healthz")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        stop(proc)
    assert got[("lta_worker_reads_total", (("endpoint", "latest-change"), ("outcome", "ok")))] == 3
    assert got[("lta_worker_reads_total", (("endpoint", "stats"), ("outcome", "ok")))] == 3
    assert got[("lta_worker_users", (("state", "active"),))] == 3
    assert got[("lta_worker_users", (("state", "revoked"),))] == 0
    assert got[("lta_worker_budget_limit", ())] == 100_000
    assert 0 < got[("lta_worker_budget_remaining", ())] < 100_000
    assert got[("lta_worker_pass_duration_seconds_count", ())] == 1
    assert got[("lta_worker_passes_total", (("stopped", "completed"),))] == 1
    assert got[("lta_worker_last_pass_success_timestamp_seconds", ())] > 0
    assert got[("lta_worker_pacer_wait_seconds_count", ())] == 6
    assert got[("lta_worker_breaker_trips_total", ())] == 0
    # No webhook.url: enrollment events wait until maintenance clears them; none is dead.
    assert got[("lta_worker_webhook_backlog", ())] >= 0
    assert got[("lta_worker_webhook_dead_letters", ())] == 0
    assert health_status == 200
    health: dict[str, Any] = json.loads(body)
    assert (health["healthy"], health["problems"]) == (True, [])
    assert json.loads(world.cli("status", "--format", "json").stdout)["healthy"] is True
    assert all(line.startswith("{") for line in world.log_lines())  # no access log


def test_serve_notices_its_key_file_gone_and_reads_on(world: Workspace) -> None:
    """A deleted key file: logged once, /healthz 503, passes read on; restored, healthy again."""
    port = free_port()
    world.configure(poll={"tick": "200ms", "interval": "1s", "max_interval": "1s"})
    world.extra = f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
    world.write_config()
    world.enroll(["ada"])
    saved = world.key_file.read_text()
    proc = world.start_serve()
    try:
        world.wait_for_event("pass.finished", proc)
        world.key_file.unlink()
        lost = world.wait_for_event("service.key_file_lost", proc)
        health_status, body = get(f"http://127.0.0.1:{port}/healthz")
        answered = len([e for e in world.sim.requests() if e.status == 200])
        assert wait_for(
            lambda: len([e for e in world.sim.requests() if e.status == 200]) > answered, timeout=20
        ), "no read after the key file was lost"
        write_private(world.key_file, saved)
        world.wait_for_event("service.key_file_back", proc)
        healthy = f"http://127.0.0.1:{port}/healthz"  # a status is reused for a second
        assert wait_for(lambda: get(healthy)[0] == 200, timeout=10, interval=0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        stop(proc)
    assert (lost["level"], lost["key"]) == ("error", "crypto.key_file")
    assert health_status == 503
    assert any("crypto.key_file" in p for p in json.loads(body)["problems"])
    names = [e["event"] for e in world.log_events()]
    assert names.count("service.key_file_lost") == 1
    assert "token.undecryptable" not in names
