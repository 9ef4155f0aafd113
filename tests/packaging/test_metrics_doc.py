"""docs/operations.md's metrics table lists exactly the metrics the worker registers, with
their types and labels."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from lta_worker.worker._metrics import Metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"

Row = tuple[str, str, tuple[str, ...]]


def registered() -> set[Row]:
    """(exposed name, type, label names) of every collector of a fresh `Metrics`: a
    counter's series are exposed as NAME_total, as the table names them."""
    rows: set[Row] = set()
    # The registry holds no public list of its collectors with their label names, and a
    # labelled gauge with no series yet (`lta_worker_users`) shows no labels when collected.
    for collector in Metrics().registry._collector_to_names:
        assert isinstance(collector, MetricWrapperBase)
        name = collector._name + ("_total" if collector._type == "counter" else "")
        rows.add((name, str(collector._type), tuple(collector._labelnames)))
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
            rows.append((name, cells[1], tuple(labels.split(",")) if labels else ()))
    return rows


def test_metrics_table_is_what_the_worker_registers() -> None:
    """Every registered metric is in the table with its type and labels, and no other."""
    rows = documented(DOC.read_text(encoding="utf-8"))
    assert len(rows) == len({name for name, _, _ in rows}), "a metric is listed twice"
    code = registered()
    assert code - set(rows) == set(), "registered, not documented as such"
    assert set(rows) - code == set(), "documented, not registered as such"
