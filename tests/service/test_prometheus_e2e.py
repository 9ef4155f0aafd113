"""The dashboard, alert rules and LogQL queries against a real Prometheus scraping a real
`serve`, and node_exporter reading `run`'s textfile (each skipped without its binary)."""

from __future__ import annotations

import math
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lta_worker.simulator import DEMO_CLIENT_ID
from support.process import Workspace, free_port, stop
from support.prometheus import (
    MISSING_NODE_EXPORTER,
    MISSING_PROMETHEUS,
    NODE_EXPORTER,
    PROMETHEUS,
    Prometheus,
    http_get,
    running_node_exporter,
    running_prometheus,
)
from support.queries import (
    DS_PROMETHEUS,
    PROMETHEUS_RULES,
    dashboard,
    logql_queries,
    query_events,
    query_fields,
    rules,
    targets,
)

# Grafana's built-in interval variables, at values that hold several 1 s scrapes.
BUILTIN = {"$__rate_interval": "15s", "$__interval": "15s", "$__range": "1m"}
# Fields every line has, and stream labels the shippers add (not JSON fields of an event).
NOT_EVENT_FIELDS = frozenset({"event", "level", "ts", "logger", "unit", "host", "job"})
# The events this run makes the worker emit (a pass, a revocation, a parked user, serve's
# heartbeat, a 429): the LogQL check below is not vacuous.
EXERCISED = {
    "poll.read",
    "pass.finished",
    "service.heartbeat",
    "token.deleted",
    "user.state_changed",
    "ratelimit.throttled",
}


def substitute(expr: str) -> str:
    """`expr` with Grafana's interval variables and each template variable at its All value
    (every instance)."""
    for name, value in BUILTIN.items():
        expr = expr.replace(name, value)
    for var in dashboard()["templating"]["list"]:
        expr = expr.replace(f"${var['name']}", var["allValue"])
    assert "$" not in expr, f"an unknown variable is left in {expr}"
    return expr


def wait_until(check: Callable[[], bool], what: Callable[[], str], timeout: float) -> None:
    """Poll `check` (a Prometheus query: scrapes come each second) until it holds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"after {timeout} s: {what()}"
        time.sleep(0.5)


def promql_queries() -> list[tuple[str, str]]:
    """(panel title, query) for every Prometheus panel query, substituted."""
    return [(title, substitute(expr)) for title, expr in targets(DS_PROMETHEUS)]


@pytest.fixture
def served_world(world: Workspace) -> Workspace:
    """Three users: one active, one revoked upstream and one parked (no sync for 100 days);
    passes every 200 ms, the adaptive schedule (its expected delay is a panel) reading
    active users every second or two, a heartbeat every second."""
    world.configure(
        poll={
            "tick": "200ms",
            "schedule": "adaptive",
            "interval": "1s",
            "max_interval": "2s",
            "parked_interval": "1s",
        },
        serve={"heartbeat": "1s"},
    )
    world.enroll({"ada": {}, "gone": {}, "sleepy": {"last_sync_age_days": 100}})
    world.sim.revoke("gone")
    return world


@pytest.mark.skipif(PROMETHEUS is None, reason=MISSING_PROMETHEUS)
@pytest.mark.timeout(120)
def test_dashboard_queries_return_data_from_a_real_prometheus(
    served_world: Workspace, tmp_path: Path
) -> None:
    """Every dashboard PromQL query returns data from Prometheus scraping serve; rules evaluate."""
    world = served_world
    port = free_port()
    world.extra = f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
    world.write_config()
    proc = world.start_serve()
    try:
        with running_prometheus(
            tmp_path / "prometheus", {"lta-worker": f"127.0.0.1:{port}"}, [PROMETHEUS_RULES]
        ) as prom:
            world.wait_for_event("token.deleted", proc)
            wait_until(
                lambda: prom.values('lta_worker_users{state="revoked"}') == [1.0],
                lambda: f"users: {prom.query('lta_worker_users')}",
                timeout=30,
            )
            queries = promql_queries()
            for _, expr in queries:
                prom.query(expr)  # parses: an error answer fails here, with Prometheus's words
            wait_until(
                lambda: all(prom.has_data(expr) for _, expr in queries),
                lambda: f"no data: {[t for t, e in queries if not prom.has_data(e)]}",
                timeout=45,
            )
            _check_facts(prom)
            _check_instance_variable(prom)
            _check_rules_evaluate(prom)
        # Last, the client's other traffic spends the budget: a 429, for the LogQL check.
        remaining = world.sim.consume_budget(DEMO_CLIENT_ID, 0)
        world.sim.consume_budget(DEMO_CLIENT_ID, remaining)
        world.wait_for_event("ratelimit.throttled", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        stop(proc)
    _check_logql_against(world.log_events())


def _check_facts(prom: Prometheus) -> None:
    """What the metrics say is what happened upstream."""
    for state, count in (("active", 1.0), ("parked", 1.0), ("revoked", 1.0)):
        assert prom.values(f'lta_worker_users{{state="{state}"}}') == [count], state
    assert prom.values('sum(lta_worker_reads_total{outcome="revoked"})')[0] >= 1
    assert prom.values('sum(lta_worker_reads_total{outcome="inactive"})')[0] >= 1
    targets_up = prom.api("targets")["activeTargets"]
    assert [t["health"] for t in targets_up] == ["up"], targets_up


def _check_instance_variable(prom: Prometheus) -> None:
    """The `$instance` variable's query (label_values of build_info) finds the target."""
    query = next(v for v in dashboard()["templating"]["list"] if v["name"] == "instance")
    match = re.fullmatch(r"label_values\((\w+), (\w+)\)", query["query"]["query"])
    assert match, query
    series = prom.api("series", **{"match[]": match.group(1)})
    assert {s[match.group(2)] for s in series}, series


def _check_rules_evaluate(prom: Prometheus) -> None:
    """Prometheus loaded every shipped rule and evaluates each without error, and none is
    pending or firing for this healthy worker."""
    wait_until(
        lambda: all(
            r.get("lastEvaluation", "").startswith("20")
            for g in prom.api("rules")["groups"]
            for r in g["rules"]
        ),
        lambda: "rules not evaluated yet",
        timeout=15,
    )
    loaded = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
    assert sorted(r["name"] for r in loaded) == sorted(name for name, _ in rules(PROMETHEUS_RULES))
    for rule in loaded:
        assert (rule["health"], rule.get("lastError", "")) == ("ok", ""), rule
    assert prom.query("ALERTS") == []


def _check_logql_against(events: list[dict[str, Any]]) -> None:
    """Each LogQL query's events, fields and compared values, for the events this serve
    emitted, are in what it emitted (the rest stay checked against docs/log-events.md)."""
    emitted: dict[str, dict[str, set[str]]] = {}
    for event in events:
        fields = emitted.setdefault(event["event"], {})
        for key, value in event.items():
            fields.setdefault(key, set()).add(str(value))
    assert set(emitted) >= EXERCISED, sorted(emitted)
    checked = set()
    for title, expr in logql_queries():
        names = query_events(expr) & set(emitted)
        if not names:
            continue
        checked |= names
        seen: dict[str, set[str]] = {}
        for name in names:
            for key, values in emitted[name].items():
                seen.setdefault(key, set()).update(values)
        for field, values in query_fields(expr).items():
            if field in NOT_EVENT_FIELDS:
                continue
            assert field in seen, f"{title}: {names} emitted no field {field!r}"
            assert values <= seen[field], f"{title}: {field} never {values - seen[field]}"
    assert checked >= EXERCISED, checked


@pytest.mark.timeout(60)
def test_node_exporter_reads_the_textfile_run_writes(world: Workspace, tmp_path: Path) -> None:
    """node_exporter exposes every sample of the textfile `run` writes, with no scrape error."""
    directory = tmp_path / "textfile"
    directory.mkdir()
    path = directory / "lta_worker.prom"
    world.extra = f'[metrics]\ntextfile = "{path}"\n'
    world.write_config()
    world.enroll({"ada": {}, "gone": {}, "sleepy": {"last_sync_age_days": 100}})
    world.sim.revoke("gone")
    done = world.cli("run")
    assert done.returncode == 0, done.stderr
    written = _samples(path.read_text(encoding="utf-8"))
    assert written[("lta_worker_users", (("state", "parked"),))] == 1
    assert written[("lta_worker_users", (("state", "revoked"),))] == 1
    assert float(written[("lta_worker_last_pass_success_timestamp_seconds", ())]) > 0
    assert [p.name for p in directory.iterdir()] == ["lta_worker.prom"]  # no temporary left
    if NODE_EXPORTER is None:
        pytest.skip(f"{MISSING_NODE_EXPORTER}; the textfile parsed with prometheus_client only")
    with running_node_exporter(directory, tmp_path / "node_exporter.log") as url:
        status, text = http_get(url)
    assert status == 200, text
    exposed = _samples(text)
    assert exposed[("node_textfile_scrape_error", ())] == 0
    ours = {k: v for k, v in exposed.items() if k[0].startswith("lta_worker_")}
    assert ours == written


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float | str]:
    """Every sample by name and sorted labels; bucket bounds as numbers (node_exporter
    writes `le="1"` where prometheus_client writes `le="1.0"`), NaN as "NaN" (so that it
    equals itself)."""

    def label(name: str, value: str) -> tuple[str, str]:
        return (name, repr(float(value))) if name == "le" else (name, value)

    return {
        (s.name, tuple(sorted(label(*item) for item in s.labels.items()))): (
            "NaN" if math.isnan(s.value) else s.value
        )
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
