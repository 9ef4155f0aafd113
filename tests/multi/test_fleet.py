"""Three `lta-worker run` processes on one PostgreSQL database and one simulator: every user read
once per endpoint within the budget less the reserve, and none lost when one is killed with -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime

import anyio
import pytest
from sqlalchemy import select

from lta_worker.storage import User, UserLease

from .conftest import READ_PATH, Fleet, Worker, per_window

pytestmark = pytest.mark.postgres

USERS = [f"user-{n:03d}" for n in range(300)]
ENDPOINTS = ("latest-change", "stats")
WINDOW = 4  # seconds
BUDGET = 120  # per window; the reserve (10%) leaves 108 to the workers together
USABLE = int(BUDGET * 0.9)


def _prepare(fleet: Fleet) -> None:
    fleet.sim.configure(budget=BUDGET, window=WINDOW)
    anyio.run(fleet.enroll, USERS)
    fleet.sim.clear_requests()


def _status(fleet: Fleet) -> dict[str, object]:
    """`lta-worker status --format json` with the first worker's config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LTA_WORKER_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lta_worker",
            "--config",
            str(fleet.tmp / "worker-0.toml"),
            "status",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    data: dict[str, object] = json.loads(done.stdout)
    return data


def _reading(workers: list[Worker]) -> int:
    """How many of `workers` have logged a read."""
    return sum(1 for w in workers if w.has_logged("poll.read"))


def _check_budget(fleet: Fleet) -> Counter[int]:
    """No 429, every answer a 200, no window over the budget less the reserve."""
    reads = fleet.reads()
    assert Counter(e.status for e in reads) == Counter({200: len(reads)})
    windows = per_window(reads, WINDOW)
    assert max(windows.values()) <= USABLE, sorted(windows.items())
    assert len(windows) >= 5  # paced over several windows
    return windows


def _check_stored(fleet: Fleet) -> None:
    """Every user's result of both endpoints is stored; nobody is due or leased any more."""
    with fleet.store() as store:
        stored = {(r.user, r.endpoint, r.status) for r in store.export_results()}
        assert stored == {(u, e, "ok") for u in USERS for e in ENDPOINTS}
        assert store.count_due(datetime.now(UTC)) == 0
        with store.database.read() as conn:
            assert conn.execute(select(UserLease.user_id)).all() == []


@pytest.mark.timeout(90)
def test_three_workers_read_every_user_exactly_once_within_the_budget(fleet: Fleet) -> None:
    """Three workers: each (user, endpoint) read once, work split, windows within budget, no 429."""
    _prepare(fleet)
    started = time.monotonic()
    workers = [fleet.start(f"worker-{n}", "run") for n in range(3)]
    fleet.wait_for("three workers reading", lambda: _reading(workers) == 3, timeout=30)
    status = _status(fleet)
    instances = status["instances"]
    assert isinstance(instances, list)
    assert sorted(i["pid"] for i in instances) == sorted(w.process.pid for w in workers)
    assert {i["kind"] for i in instances} == {"run"}
    codes = [w.wait(timeout=75) for w in workers]
    wall = time.monotonic() - started
    assert codes == [0, 0, 0], "\n".join(w.tail() for w in workers)

    reads = fleet.reads()
    per_read = Counter((e.user, e.path) for e in reads)
    assert set(per_read) == {(u, READ_PATH + e) for u in USERS for e in ENDPOINTS}
    assert max(per_read.values()) == 1
    windows = _check_budget(fleet)
    shares = [w.events("pass.finished")[0]["reads"] for w in workers]
    assert sum(shares) == 600
    assert min(shares) > 0
    _check_stored(fleet)
    assert _status(fleet)["instances"] == []  # each unregistered on exit
    print(
        f"\nthree workers: {len(reads)} reads in {wall:.1f} s; reads per {WINDOW} s window "
        f"{[windows[k] for k in sorted(windows)]} (budget {BUDGET}, less reserve {USABLE}); "
        f"per worker {shares}"
    )


@pytest.mark.timeout(90)
def test_a_killed_worker_leaves_no_user_behind(fleet: Fleet) -> None:
    """SIGKILL one of three mid-pass: its users are read after its leases expire, none lost."""
    fleet.poll["lease_duration"] = "3s"
    _prepare(fleet)
    started = time.monotonic()
    victim, *survivors = [fleet.start(f"worker-{n}", "run") for n in range(3)]
    fleet.wait_for(
        "a third of the reads, some by each worker",
        lambda: len(fleet.reads()) >= 200 and _reading([victim, *survivors]) == 3,
        timeout=45,
    )
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(timeout=10)
    killed_at = datetime.now(UTC)
    instance = victim.events("pass.started")[0]["instance"]
    with fleet.store() as store, store.database.read() as conn:
        leased = {
            row.user: row.lease_expires_at
            for row in conn.execute(
                select(User.user, UserLease.expires_at.label("lease_expires_at"))
                .join(UserLease, UserLease.user_id == User.id)
                .where(UserLease.owner == instance)
            )
        }
    assert leased, "the killed worker held no lease: nothing was tested"
    codes = [w.wait(timeout=75) for w in survivors]
    wall = time.monotonic() - started
    assert codes == [0, 0], "\n".join(w.tail() for w in survivors)

    reads = fleet.reads()
    per_read = Counter((e.user, e.path) for e in reads)
    assert set(per_read) == {(u, READ_PATH + e) for u in USERS for e in ENDPOINTS}
    twice = {user for (user, _), n in per_read.items() if n > 1}
    assert twice <= set(leased)
    for user, expires in leased.items():
        later = [e for e in reads if e.user == user and e.at >= killed_at]
        assert later, f"{user} was not read after the kill"
        assert all(e.at > expires for e in later)  # not before its lease expired
    windows = _check_budget(fleet)
    _check_stored(fleet)
    assert _status(fleet)["instances"] == []  # the dead one's heartbeat is long stale
    expired = [e for w in survivors for e in w.events("instance.lease_expired")]
    assert {e["instance"] for e in expired} == {instance}
    assert sum(e["users"] for e in expired) == len(leased)
    assert all(e["level"] == "warning" for e in expired)
    print(
        f"\nkill -9: {len(reads)} reads in {wall:.1f} s, {len(leased)} users leased by the "
        f"dead worker, {len(twice)} read twice; reads per {WINDOW} s window "
        f"{[windows[k] for k in sorted(windows)]} (budget {BUDGET}, less reserve {USABLE})"
    )
