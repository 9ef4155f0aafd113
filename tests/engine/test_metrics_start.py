"""The metrics of a worker that has just started: what the database knows, before any read."""

from __future__ import annotations

from pathlib import Path

import pytest

from lta_worker.domain import ENDPOINTS, OUTCOME_KINDS
from lta_worker.simulator import DEMO_CLIENT_ID

from .conftest import Harness

pytestmark = pytest.mark.anyio


async def test_a_restarted_worker_reports_the_budget_and_every_read_series(
    harness: Harness, tmp_path: Path
) -> None:
    """Before any read: the budget gauges from the database, every reads series at 0."""
    h = harness
    h.sim.configure(budget=120, window=3600)
    await h.enroll("ada")
    assert (await h.run_pass()).exit_code == 0
    with h.store() as store:
        seen = store.budget_seen(DEMO_CLIENT_ID)
    assert seen is not None and seen.remaining is not None and seen.remaining < 120
    h.configure("metrics", textfile=str(tmp_path / "lta_worker.prom"))
    worker = h.worker()
    async with worker:
        assert worker.metrics is not None
        value = worker.metrics.registry.get_sample_value
        assert value("lta_worker_budget_limit") == 120
        assert value("lta_worker_budget_remaining") == seen.remaining
        for endpoint in ENDPOINTS:
            for outcome in OUTCOME_KINDS:
                labels = {"endpoint": endpoint, "outcome": outcome}
                assert value("lta_worker_reads_total", labels) == 0, labels
