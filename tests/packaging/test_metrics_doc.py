"""docs/operations.md's metrics table lists exactly the metrics the worker registers, with
their types and labels."""

from __future__ import annotations

import re
from pathlib import Path

from lta_worker.worker._metrics import Metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"

Row = tuple[str, str, tuple[str, ...]]


def registered() -> set[Row]:
    """(exposed name, type, label names) of every metric a fresh `Metrics` exposes."""
    rows: set[Row] = set()
    for metric in Metrics().registry.collect():
        name = metric.name + ("_total" if metric.type == "counter" else "")
        labels = {k for sample in metric.samples for k in sample.labels if k != "le"}
        assert metric.samples, f"{metric.name}: no series to show its labels"
        rows.add((name, metric.type, tuple(sorted(labels))))
    return rows


def documented(text: str) -> list[Row]:
    """The metrics table's rows: "| `name{a,b}`, `other` | type | meaning |"."""
    start = text.index("| metric | type | meaning |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for name, labels in re.findall(r"`(lta_worker_\w+)(?:\{([^}]*)\})?`", cells[0]):
            rows.append((name, cells[1], tuple(sorted(labels.split(","))) if labels else ()))
    return rows


def test_metrics_table_is_what_the_worker_registers() -> None:
    """Every registered metric is in the table with its type and labels, and no other."""
    rows = documented(DOC.read_text(encoding="utf-8"))
    assert len(rows) == len({name for name, _, _ in rows}), "a metric is listed twice"
    code = registered()
    assert code - set(rows) == set(), "registered, not documented as such"
    assert set(rows) - code == set(), "documented, not registered as such"
