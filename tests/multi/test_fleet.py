"""Three `lta-worker run` processes on one PostgreSQL database and one simulator: every user read
once per endpoint within the budget less the reserve (kill -9 of one of a fleet: B6's soak, run
by tests/bench/test_bench_smoke.py; the leases it left: tests/engine/test_lease_stall.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest
from sqlalchemy import select

from lta_worker.storage import UserLease

from .conftest import READ_PATH, Fleet, per_window

pytestmark = pytest.mark.postgres

USERS = [f"user-{n:03d}" for n in range(300)]
ENDPOINTS = ("latest-change", "stats")
WINDOW = 4  # seconds
BUDGET = 120  # per window; the reserve (10%) leaves 108 to the workers together
USABLE = int(BUDGET * 0.9)


def _status(fleet: Fleet) -> Any:
    """`lta-worker status --format json` with the first worker's config."""
    config = str(fleet.tmp / "worker-0.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LTA_WORKER_")}
    done = subprocess.run(
        [sys.executable, "-m", "lta_worker", "--config", config, "status", "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.timeout(90)
def test_three_workers_read_every_user_exactly_once_within_the_budget(fleet: Fleet) -> None:
    """Three workers: each (user, endpoint) read once, work split, windows within budget, no 429."""
    fleet.sim.configure(budget=BUDGET, window=WINDOW)
    anyio.run(fleet.enroll, USERS)
    fleet.sim.clear_requests()
    started = time.monotonic()
    workers = [fleet.start(f"worker-{n}", "run") for n in range(3)]
    fleet.wait_for(
        "three workers reading", lambda: all(w.has_logged("poll.read") for w in workers), 30
    )
    instances = _status(fleet)["instances"]
    assert sorted(i["pid"] for i in instances) == sorted(w.process.pid for w in workers)
    assert {i["kind"] for i in instances} == {"run"}
    codes = [w.wait(timeout=75) for w in workers]
    wall = time.monotonic() - started
    assert codes == [0, 0, 0], "\n".join(w.tail() for w in workers)

    reads = fleet.reads()
    per_read = Counter((e.user, e.path) for e in reads)
    assert set(per_read) == {(u, READ_PATH + e) for u in USERS for e in ENDPOINTS}
    assert max(per_read.values()) == 1
    assert Counter(e.status for e in reads) == Counter({200: len(reads)})  # no 429
    windows = per_window(reads, WINDOW)
    assert max(windows.values()) <= USABLE, sorted(windows.items())
    assert len(windows) >= 5  # paced over several windows
    shares = [w.events("pass.finished")[0]["reads"] for w in workers]
    assert sum(shares) == 600
    assert min(shares) > 0
    with fleet.store() as store:
        stored = {(r.user, r.endpoint, r.status) for r in store.export_results()}
        assert stored == {(u, e, "ok") for u in USERS for e in ENDPOINTS}
        assert store.count_due(datetime.now(UTC)) == 0
        with store.database.read() as conn:
            assert conn.execute(select(UserLease.user_id)).all() == []
    assert _status(fleet)["instances"] == []  # each unregistered on exit
    print(
        f"\nthree workers: {len(reads)} reads in {wall:.1f} s; reads per {WINDOW} s window "
        f"{[windows[k] for k in sorted(windows)]} (budget {BUDGET}, less reserve {USABLE}); "
        f"per worker {shares}"
    )
