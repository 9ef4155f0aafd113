"""The queries of deploy/ (dashboard, alert rules, template variables) and what a LogQL query
asks of the log lines. No YAML library: the rules files keep one `- alert:` and one single-line
`expr:` per rule, which `rules()` reads and checks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana-dashboard.json"
PROMETHEUS_RULES = DEPLOY / "prometheus-rules.yml"
LOKI_RULES = DEPLOY / "loki-rules.yml"
DS_LOKI = "${DS_LOKI}"
DS_PROMETHEUS = "${DS_PROMETHEUS}"

# LogQL words that follow `|` but are not label filters.
LOGQL_STAGES = frozenset({"json", "logfmt", "unwrap", "line_format", "label_format", "drop"})


def dashboard() -> dict[str, Any]:
    """deploy/grafana-dashboard.json, parsed."""
    board: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return board


def panels(datasource: str) -> list[dict[str, Any]]:
    """The panels that query `datasource` (`DS_LOKI` or `DS_PROMETHEUS`), in dashboard order."""
    return [
        p
        for p in dashboard()["panels"]
        if p.get("type") != "row" and p["datasource"]["uid"] == datasource
    ]


def targets(datasource: str) -> list[tuple[str, str]]:
    """(panel title, expression) for every query of every panel on `datasource`."""
    return [
        (panel["title"], target["expr"])
        for panel in panels(datasource)
        for target in panel.get("targets", [])
    ]


def variable(name: str) -> dict[str, Any]:
    """The dashboard's template variable `name`."""
    found: dict[str, Any] = next(v for v in dashboard()["templating"]["list"] if v["name"] == name)
    return found


def rules(path: Path) -> list[tuple[str, str]]:
    """(alert, expression) of every rule of a rules file (one-line `expr:` each)."""
    text = path.read_text(encoding="utf-8")
    names = re.findall(r"(?m)^\s+- alert: (\S+)$", text)
    exprs = re.findall(r"(?m)^\s+expr: (.+)$", text)
    assert len(names) == len(exprs), f"{path.name}: every rule needs one single-line expr"
    return list(zip(names, exprs, strict=True))


def logql_queries() -> list[tuple[str, str]]:
    """Every LogQL query shipped: the dashboard's Loki panels, then the Loki rules."""
    return targets(DS_LOKI) + [(f"rule {name}", expr) for name, expr in rules(LOKI_RULES)]


def stream_selectors(expr: str) -> list[str]:
    """The stream selectors of a LogQL query (`{unit=~"...", host=~"..."}`)."""
    return re.findall(r"\{[^{}]*\}", expr)


def pipeline(expr: str) -> str:
    """The expression without its stream selectors."""
    return re.sub(r"\{[^{}]*\}", "", expr)


def query_events(expr: str) -> set[str]:
    """The `event` values a LogQL query filters on."""
    return set(re.findall(r'\|\s*event\s*=\s*"([^"]+)"', expr))


def query_fields(expr: str) -> dict[str, set[str]]:
    """JSON fields a query filters on, unwraps or groups by -> equality values it compares."""
    body = pipeline(expr)
    fields: dict[str, set[str]] = {}
    for name, op, value in re.findall(
        r'\|\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|==|>=|<=|=|>|<)\s*("[^"]*"|[\w.]+)', body
    ):
        if name in LOGQL_STAGES or name.startswith("__"):
            continue
        values = fields.setdefault(name, set())
        if op in {"=", "=="} and value.startswith('"'):
            values.add(value.strip('"'))
    for name in re.findall(r"\bunwrap\s+(?:[a-z_]+\()?([A-Za-z_][A-Za-z0-9_]*)", body):
        fields.setdefault(name, set())
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", body):
        for name in filter(None, (n.strip() for n in group.split(","))):
            fields.setdefault(name, set())
    return fields


def exposed_metrics() -> set[str]:
    """Every sample name the worker's registry exposes (each labelled series given a value)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from lta_worker.worker._metrics import Metrics

    metrics = Metrics()
    metrics.on_read("stats", "ok", 0.1)
    metrics.users.labels(state="active").set(1)
    metrics.pass_duration.observe(1.0)
    text = generate_latest(metrics.registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}
